"""Volcano's Queue validating webhook, reimplemented from its source.

volcano @ ed72c7c pkg/webhooks/admission/queues/validate/validate_queue.go (and
pkg/scheduler/api/resource_info.go for the resource arithmetic, in quantity.py).
Each rule is one function naming the upstream function it follows. A refusal is
the webhook's error as a Status message, so the API server answers 400.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.kubefake.quantity import VolcanoResource, quantity

QUEUE_VALIDATE = "validatequeue.volcano.sh"

Queues = Callable[[], list[dict[str, Any]]]


def validate_resource_quantities(spec: dict[str, Any]) -> list[str]:
    """validateResourceQuantityOfQueue: guarantee <= deserved <= capability, per resource."""
    path = "requestBody.spec"
    errors = []
    capability, deserved = spec.get("capability") or {}, spec.get("deserved") or {}
    for name, guarantee in ((spec.get("guarantee") or {}).get("resource") or {}).items():
        if name not in deserved:
            errors.append(
                f'{path}.deserved.{name}: Invalid value: "<nil>": deserved[{name}] must be >= '
                f"guarantee[{name}]={guarantee}"
            )
        elif quantity(deserved[name]) < quantity(guarantee):
            errors.append(
                f'{path}.deserved.{name}: Invalid value: "{deserved[name]}": '
                f"deserved[{name}]={deserved[name]} must be >= guarantee[{name}]={guarantee}"
            )
    for name, value in deserved.items():
        if name in capability and quantity(value) > quantity(capability[name]):
            errors.append(
                f'{path}.deserved.{name}: Invalid value: "{value}": deserved[{name}]={value} '
                f"must be <= capability[{name}]={capability[name]}"
            )
    return errors


def validate_queue_state(status: dict[str, Any]) -> list[str]:
    """validateStateOfQueue: an empty state, Open or Closed."""
    state = status.get("state", "")
    if state in ("", "Open", "Closed"):
        return []
    return [
        f'requestBody.spec.state: Invalid value: "{state}": queue state must be in [Open Closed]'
    ]


def _format(name: str, value: float) -> str:
    """validate_queue.go formatResourceWithType."""
    if name == "cpu":
        return f"{int(value)}m" if value % 1000 else str(int(value // 1000))
    if name == "memory":
        return str(int(value))
    return f"{value:.2f}"


def _parent_chain(queue: dict[str, Any], by_name: dict[str, dict[str, Any]]) -> list[dict]:
    chain, parent = [], (queue.get("spec") or {}).get("parent", "")
    while parent and parent != "root" and parent in by_name:
        chain.append(by_name[parent])
        parent = (by_name[parent].get("spec") or {}).get("parent", "")
    return chain


def validate_child_against_ancestor(queue: dict[str, Any], by_name: dict[str, dict]) -> str:
    """validateChildAgainstAncestor: a capability within the nearest ancestor's capability."""
    own = VolcanoResource.of((queue.get("spec") or {}).get("capability"))
    for name in own.names():
        for ancestor in _parent_chain(queue, by_name):
            limit = VolcanoResource.of((ancestor.get("spec") or {}).get("capability")).get(name)
            if limit > 0:
                if own.get(name) > limit:
                    return (
                        f"queue {queue['metadata']['name']} capability[{name}]="
                        f"{_format(name, own.get(name))} exceeds its ancestor's capability="
                        f"{_format(name, limit)}"
                    )
                break
    return ""


def _sum_check(parent: dict[str, Any], members: list[dict[str, Any]], label: str) -> str:
    """The guarantee and deserved sums of validateSiblingsSum / validateChildrenConstraints."""
    spec = parent.get("spec") or {}
    limit_guarantee = VolcanoResource.of((spec.get("guarantee") or {}).get("resource"))
    limit_deserved = VolcanoResource.of(spec.get("deserved"))
    guarantee, deserved = VolcanoResource(), VolcanoResource()
    for member in members:
        member_spec = member.get("spec") or {}
        guarantee.add(VolcanoResource.of((member_spec.get("guarantee") or {}).get("resource")))
        if limit_guarantee.less_partly(guarantee):
            return (
                f"{label} {parent['metadata']['name']} validation failed: sum of children's "
                f"guarantee ({guarantee}) exceeds parent's guarantee limit ({limit_guarantee})"
            )
        deserved.add(VolcanoResource.of(member_spec.get("deserved")))
        if limit_deserved.less_partly(deserved):
            return (
                f"{label} {parent['metadata']['name']} validation failed: sum of children's "
                f"deserved ({deserved}) exceeds parent's deserved limit ({limit_deserved})"
            )
    return ""


def validate_siblings_sum(queue: dict, parent: dict, queues: list[dict]) -> str:
    """validateSiblingsSum: the siblings' and this queue's guarantee and deserved, summed,
    within the parent's (a parent without deserved has a zero limit)."""
    name = queue["metadata"]["name"]
    siblings = [
        q
        for q in queues
        if (q.get("spec") or {}).get("parent") == parent["metadata"]["name"]
        and q["metadata"]["name"] != name
    ]
    return _sum_check(parent, [*siblings, queue], "parent queue")


def _subtree_max_capability(queue: dict, name: str, queues: list[dict]) -> float:
    value = VolcanoResource.of((queue.get("spec") or {}).get("capability")).get(name)
    if value > 0:
        return value
    children = [
        q for q in queues if (q.get("spec") or {}).get("parent") == queue["metadata"]["name"]
    ]
    return max((_subtree_max_capability(c, name, queues) for c in children), default=0.0)


def validate_children_constraints(queue: dict, queues: list[dict]) -> str:
    """validateChildrenConstraints: capability at least every descendant's, and the children's
    guarantee and deserved within this queue's."""
    children = [
        q for q in queues if (q.get("spec") or {}).get("parent") == queue["metadata"]["name"]
    ]
    if not children:
        return ""
    own = VolcanoResource.of((queue.get("spec") or {}).get("capability"))
    if (queue.get("spec") or {}).get("capability") is not None:
        for name in own.names():
            most = max(_subtree_max_capability(c, name, queues) for c in children)
            if own.get(name) < most:
                return (
                    f"queue {queue['metadata']['name']} capability[{name}]="
                    f"{_format(name, own.get(name))} is smaller than its descendants' max "
                    f"capability={_format(name, most)}"
                )
    return _sum_check(queue, children, "queue")


def validate_queue(queue: dict[str, Any], old: dict[str, Any] | None, queues: Queues) -> str:
    """validate_queue.go AdmitQueues for CREATE and UPDATE: the refusal message, or ""."""
    spec = queue.get("spec") or {}
    errors = validate_resource_quantities(spec) + validate_queue_state(queue.get("status") or {})
    if errors:
        return errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    name, parent_name = queue["metadata"]["name"], spec.get("parent", "")
    others = [q for q in queues() if q["metadata"]["name"] != name]
    by_name = {q["metadata"]["name"]: q for q in others}
    old_spec = (old or {}).get("spec") or {}
    # validateHierarchicalQueue, on create or when the parent changes.
    if (old is None or old_spec.get("parent", "") != parent_name) and parent_name not in (
        "",
        "root",
    ):
        if parent_name == name:
            return f"queue {name} cannot use itself as parent"
        if parent_name not in by_name:
            return (
                f"failed to get parent queue of queue {name}: "
                f'queue.scheduling.volcano.sh "{parent_name}" not found'
            )
    # needsValidateHierarchicalQueue: on create, or when parent or resources change.
    resources = ("parent", "capability", "deserved", "guarantee")
    if name == "root" or (
        old is not None and all(old_spec.get(k) == spec.get(k) for k in resources)
    ):
        return ""
    everyone = [*others, queue]
    if parent_name not in ("", "root"):
        if parent_name not in by_name:
            return (
                f"parent queue {parent_name} not found: "
                f'queue.scheduling.volcano.sh "{parent_name}" not found'
            )
        problem = validate_child_against_ancestor(queue, by_name)
        problem = problem or validate_siblings_sum(queue, by_name[parent_name], everyone)
        if problem:
            return problem
    return validate_children_constraints(queue, everyone)
