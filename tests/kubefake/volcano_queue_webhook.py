"""Volcano's Queue validating webhook, reimplemented from its source.

volcano @ ed72c7c pkg/webhooks/admission/queues/validate/validate_queue.go (and
pkg/scheduler/api/resource_info.go for the resource arithmetic, in quantity.py),
with the webhook manager's defaults from cmd/webhook-manager/app/options/options.go
(read at the same commit) and the quantity checks it borrows from Kubernetes
(pkg/apis/core/validation ValidateResourceQuantityValue). Each rule is one function
naming the upstream function it follows. A refusal is the webhook's error as a
Status message, so the API server answers 400.

On UPDATE (the broker's merge patch of the parent queue), AdmitQueues runs
validateQueue (quantities; guarantee <= deserved <= capability), the root queue's
protection, and, when the parent or a resource list changed,
validateHierarchicalQueueResources: the queue's capability within its nearest
ancestor's, its deserved and guarantee summed with its siblings' within its
parent's, and, for a parent, its capability at least each child subtree's and its
deserved and guarantee at least its children's sums (validateChildrenConstraints).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.kubefake.quantity import VolcanoResource, quantity

QUEUE_VALIDATE = "validatequeue.volcano.sh"

Queues = Callable[[], list[dict[str, Any]]]


# k8s.io/kubernetes pkg/apis/core/helper IsIntegerResourceName: these standard resources
# and every extended resource (nvidia.com/gpu) count whole units.
_INTEGER_RESOURCES = {
    "pods",
    "services",
    "replicationcontrollers",
    "resourcequotas",
    "secrets",
    "configmaps",
    "persistentvolumeclaims",
    "services.nodeports",
    "services.loadbalancers",
}


def _quantity_value(name: str, value: Any, path: str) -> list[str]:
    """k8s.io/kubernetes pkg/apis/core/validation ValidateResourceQuantityValue, which
    validateResourceQuantityOfQueue calls for every capability, deserved and guarantee
    entry: not negative (ValidateNonnegativeQuantity), and whole for an integer resource.
    (Upstream prints the bad integer as the Quantity it parsed; here as it was written.)"""
    errors = []
    if quantity(value) < 0:
        errors.append(f'{path}: Invalid value: "{value}": must be greater than or equal to 0')
    # IsExtendedResourceName: not native (a domain, not kubernetes.io) nor a quota request
    extended = "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")
    integer = name in _INTEGER_RESOURCES or extended
    if integer and round(quantity(value) * 1000) % 1000:
        errors.append(f'{path}: Invalid value: "{value}": must be an integer')
    return errors


def validate_resource_quantities(spec: dict[str, Any]) -> list[str]:
    """validateResourceQuantityOfQueue: every quantity valid, and guarantee <= deserved <=
    capability, per resource."""
    path = "requestBody.spec"
    errors = []
    capability, deserved = spec.get("capability") or {}, spec.get("deserved") or {}
    for name, value in capability.items():
        errors += _quantity_value(name, value, f"{path}.capability.{name}")
    for name, value in deserved.items():
        errors += _quantity_value(name, value, f"{path}.deserved.{name}")
    for name, guarantee in ((spec.get("guarantee") or {}).get("resource") or {}).items():
        errors += _quantity_value(name, guarantee, f"{path}.guarantee.resource.{name}")
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


# cmd/webhook-manager/app/options/options.go: --max-queue-depth (5) and
# --enable-root-queue-protection (true), their defaults.
MAX_QUEUE_DEPTH = 5
ROOT_QUEUE_PROTECTION = True
RESOURCES = ("capability", "deserved", "guarantee")
ROOT_PROTECTED = (
    "root queue's resource attributes (capability, deserved, guarantee) cannot be modified"
)


def _resources(spec: dict[str, Any], which: str) -> dict[str, float]:
    found = spec.get(which) or {}
    if which == "guarantee":
        found = found.get("resource") or {}
    return {name: quantity(value) for name, value in found.items()}


def _same_resources(old_spec: dict[str, Any], spec: dict[str, Any], which: str) -> bool:
    """equality.Semantic.DeepEqual of two ResourceLists: quantities compared by value
    ("1" equals "1000m"), an absent list equal to an empty one."""
    return _resources(old_spec, which) == _resources(spec, which)


def validate_hierarchical_queue(queue: dict[str, Any], stored: dict[str, dict]) -> str:
    """validateHierarchicalQueue with validateQueueDepth, on create or when the parent
    changes: not its own parent, at most MAX_QUEUE_DEPTH deep, an existing parent, and a
    parent that runs no pods of its own unless it has children already."""
    name, parent_name = queue["metadata"]["name"], (queue.get("spec") or {}).get("parent", "")
    if parent_name in ("", "root"):
        return ""
    if parent_name == name:
        return f"queue {name} cannot use itself as parent"
    depth, parent = 1, parent_name
    while parent not in ("", "root"):
        depth += 1
        if depth > MAX_QUEUE_DEPTH:
            return f"queue {name} exceeds the maximum allowed depth of {MAX_QUEUE_DEPTH}"
        if parent not in stored:
            return (
                f"failed to get parent queue {parent} of queue {name}: "
                f'queue.scheduling.volcano.sh "{parent}" not found'
            )
        parent = (stored[parent].get("spec") or {}).get("parent", "")
    children = [q for q in stored.values() if (q.get("spec") or {}).get("parent") == parent_name]
    allocated = ((stored[parent_name].get("status") or {}).get("allocated") or {}).get("pods")
    if not children and allocated and quantity(allocated) != 0:
        return (
            f"queue {parent_name} cannot be the parent queue of queue {name} because it has "
            f"allocated Pods: {int(quantity(allocated))}"
        )
    return ""


def validate_queue(queue: dict[str, Any], old: dict[str, Any] | None, queues: Queues) -> str:
    """validate_queue.go AdmitQueues for CREATE and UPDATE: the refusal message, or ""."""
    spec = queue.get("spec") or {}
    errors = validate_resource_quantities(spec) + validate_queue_state(queue.get("status") or {})
    if errors:
        return errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    name, parent_name = queue["metadata"]["name"], spec.get("parent", "")
    # What the webhook's informer holds: on an update, this queue as it was.
    stored = {q["metadata"]["name"]: q for q in queues()}
    others = [q for n, q in stored.items() if n != name]
    by_name = {q["metadata"]["name"]: q for q in others}
    old_spec = (old or {}).get("spec") or {}
    if old is None or old_spec.get("parent", "") != parent_name:
        problem = validate_hierarchical_queue(queue, stored)
        if problem:
            return problem
    # The root queue's resources are the scheduler's (options.go --enable-root-queue-protection).
    changed = not all(_same_resources(old_spec, spec, which) for which in RESOURCES)
    if ROOT_QUEUE_PROTECTION and old is not None and name == "root" and changed:
        return ROOT_PROTECTED
    # needsValidateHierarchicalQueue: never for root; on create, or when the parent or a
    # resource list changes (compared semantically).
    if name == "root" or (
        old is not None and old_spec.get("parent", "") == parent_name and not changed
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
