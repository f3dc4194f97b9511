"""Built-in admission the API server runs for every request, reimplemented.

* NamespaceLifecycle (k8s.io/kubernetes plugin/pkg/admission/namespace/lifecycle):
  a namespaced object cannot be created in a namespace that does not exist.
* Priority (plugin/pkg/admission/priority/admission.go): a pod's
  ``priorityClassName`` resolves to the PriorityClass's value in ``spec.priority``
  (no name: the global default class, else 0); a pod that names an unknown class,
  or sets a ``spec.priority`` that differs, is refused with 403 Forbidden.
* ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1, documented in
  "Validating Admission Policy"): each policy with a binding whose
  matchConstraints cover the request is evaluated with tests/vap_cel.py
  (cel-python); a failed validation denies it with 422 Invalid,
  ``ValidatingAdmissionPolicy '<policy>' with binding '<binding>' denied request: <message>``.
"""

from __future__ import annotations

from typing import Any

from tests.kubefake.resources import BY_KIND, RequestInfo
from tests.kubefake.status import ApiError
from tests.kubefake.store import Store
from tests.vap_cel import evaluate


def _get(store: Store, api_version: str, kind: str, name: str, namespace: str = "") -> Any:
    return store.get(BY_KIND[(api_version, kind)], namespace, name)


def namespace_lifecycle(store: Store, info: RequestInfo) -> None:
    if not (info.resource.namespaced and info.namespace):
        return
    if _get(store, "v1", "Namespace", info.namespace) is None:
        raise ApiError(
            404,
            f'namespaces "{info.namespace}" not found',
            details={"name": info.namespace, "kind": "namespaces"},
        )


def priority(store: Store, pod: dict[str, Any]) -> dict[str, Any]:
    """Pod priority from its PriorityClass (the Priority admission plugin)."""
    spec = pod.setdefault("spec", {})
    name = pod["metadata"].get("name") or pod["metadata"].get("generateName", "")
    classes, _ = store.list(BY_KIND[("scheduling.k8s.io/v1", "PriorityClass")])
    wanted = spec.get("priorityClassName")
    if wanted:
        found = next((c for c in classes if c["metadata"]["name"] == wanted), None)
        if found is None:
            raise ApiError(
                403, f'pods "{name}" is forbidden: no PriorityClass with name {wanted} was found'
            )
    else:
        found = next((c for c in classes if c.get("globalDefault")), None)
        if found is not None:
            spec["priorityClassName"] = found["metadata"]["name"]
    value = int(found["value"]) if found is not None else 0
    if spec.get("priority") is not None and spec["priority"] != value:
        raise ApiError(
            403,
            f'pods "{name}" is forbidden: the integer value of priority ({spec["priority"]}) '
            "must not be provided in pod spec; priority admission controller computed "
            f"{value} from the given PriorityClass name",
        )
    spec["priority"] = value
    if found is not None and found.get("preemptionPolicy"):
        spec.setdefault("preemptionPolicy", found["preemptionPolicy"])
    return pod


def _rule_covers(rule: dict[str, Any], info: RequestInfo, operation: str) -> bool:
    def has(values: list[str], value: str) -> bool:
        return "*" in values or value in values

    return (
        has(rule.get("apiGroups", []), info.resource.group)
        and has(rule.get("apiVersions", []), info.resource.version)
        and has(rule.get("operations", []), operation)
        and has(rule.get("resources", []), info.rbac_resource)
    )


def admission_policies(
    store: Store,
    info: RequestInfo,
    operation: str,
    *,
    old: dict[str, Any],
    new: dict[str, Any],
    user: str,
) -> None:
    """Every bound ValidatingAdmissionPolicy covering the request; the first denial raises."""
    policies, _ = store.list(
        BY_KIND[("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy")]
    )
    bindings, _ = store.list(
        BY_KIND[("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding")]
    )
    for policy in policies:
        rules = (policy["spec"].get("matchConstraints") or {}).get("resourceRules") or []
        if not any(_rule_covers(rule, info, operation) for rule in rules):
            continue
        for binding in bindings:
            if binding["spec"].get("policyName") != policy["metadata"]["name"]:
                continue
            if "Deny" not in (binding["spec"].get("validationActions") or []):
                continue
            denied = evaluate(policy, old=old, new=new, username=user)
            if denied:
                raise ApiError(
                    422,
                    f"ValidatingAdmissionPolicy '{policy['metadata']['name']}' with binding "
                    f"'{binding['metadata']['name']}' denied request: {denied[0]}",
                    reason="Invalid",
                )
