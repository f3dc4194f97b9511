"""The pods/eviction subresource, honouring PodDisruptionBudgets.

Reimplemented from the Kubernetes documentation "API-initiated Eviction" and
"Specifying a Disruption Budget for your Application" (upstream:
k8s.io/kubernetes pkg/registry/core/pod/storage/eviction.go, which is not in the
reference, so the rules below are the documented ones):

* the Eviction's name must be the pod's; a missing pod is 404;
* a pod that is Pending, Succeeded or Failed, or already being deleted, is
  deleted without consulting any budget (canIgnorePDB);
* a pod matched by more than one PodDisruptionBudget of its namespace is a 500
  ("This pod has more than one PodDisruptionBudget, which the eviction
  subresource does not support.");
* with one budget whose ``status.disruptionsAllowed`` is 0 the eviction is
  refused with 429 TooManyRequests and a DisruptionBudget cause; otherwise the
  budget's disruptionsAllowed is decremented, the pod recorded in its
  ``disruptedPods`` and the pod deleted (201, Status Success).

The disruption controller, which recomputes ``disruptionsAllowed`` from healthy
pods, is not reproduced: a test sets a budget's status (``fake.write_status``).
The evicted pod is deleted gracefully (pods.py): it gets the ``DisruptionTarget``
condition (reason ``EvictionByEvictionAPI``, PodDisruptionConditions, GA in 1.31)
and fails, so its controller sees why, and stays Terminating until the test
finishes its termination.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tests.kubefake.resources import BY_KIND, RequestInfo
from tests.kubefake.selectors import match_structured
from tests.kubefake.status import ApiError, not_found, success
from tests.kubefake.store import now

if TYPE_CHECKING:
    from tests.kubefake.fake import KubeFake

PDB = ("policy/v1", "PodDisruptionBudget")


def _can_ignore_budget(pod: dict[str, Any]) -> bool:
    phase = (pod.get("status") or {}).get("phase", "Pending")
    return phase in ("Pending", "Succeeded", "Failed") or bool(
        pod["metadata"].get("deletionTimestamp")
    )


def evict(fake: KubeFake, info: RequestInfo, body: Any) -> dict[str, Any]:
    named = ((body or {}).get("metadata") or {}).get("name")
    if named and named != info.name:
        raise ApiError(400, "name in URL does not match name in Eviction object")
    pod = fake.store.get(info.resource, info.namespace, info.name)
    if pod is None:
        raise not_found("pods", "", info.name)
    if not _can_ignore_budget(pod):
        budgets = [
            b
            for b in fake.store.list(BY_KIND[PDB], info.namespace)[0]
            if match_structured(
                (b.get("spec") or {}).get("selector"), pod["metadata"].get("labels")
            )
        ]
        if len(budgets) > 1:
            raise ApiError(
                500,
                "This pod has more than one PodDisruptionBudget, which the eviction subresource "
                "does not support.",
            )
        if budgets:
            _take_disruption(fake, budgets[0], info.name)
    fake.pods.delete(pod, evicted=True)
    return success(201)


def _take_disruption(fake: KubeFake, budget: dict[str, Any], pod: str) -> None:
    status = dict(budget.get("status") or {})
    allowed = int(status.get("disruptionsAllowed", 0))
    if allowed <= 0:
        name = budget["metadata"]["name"]
        raise ApiError(
            429,
            "Cannot evict pod as it would violate the pod's disruption budget.",
            details={
                "causes": [
                    {
                        "reason": "DisruptionBudget",
                        "message": (
                            f"The disruption budget {name} needs "
                            f"{status.get('desiredHealthy', 0)} healthy pods and has "
                            f"{status.get('currentHealthy', 0)} currently"
                        ),
                    }
                ]
            },
        )
    status["disruptionsAllowed"] = allowed - 1
    status["disruptedPods"] = {**(status.get("disruptedPods") or {}), pod: now()}
    fake.write_status(BY_KIND[PDB], budget, status)
