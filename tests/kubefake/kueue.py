"""Kueue's admission of a JobSet by quota, when the test says so (kueue @ ff69552).

Reproduced from pkg/controller/jobs/jobset/jobset_controller.go (PodSets: one pod
set per replicated Job, ``replicas * min(parallelism, completions)`` pods;
RunWithPodSetsInfo: unsuspend and merge the flavor's nodeLabels and tolerations
into the pod template) and the concepts pages cluster_queue.md and
local_queue.md: the JobSet's ``kueue.x-k8s.io/queue-name`` names a LocalQueue of
its namespace, which points at a ClusterQueue; the ClusterQueue must select the
namespace; for each resource group, the first flavor in which every requested
resource fits is assigned, where a request fits when it is within the unused
``nominalQuota``, or (borrowing, in a cohort) within ``nominalQuota +
borrowingLimit`` and the quota the cohort's other ClusterQueues leave unused
(up to their ``lendingLimit``). Admitted usage is released when the JobSet ends
or is deleted.

Not reproduced: Workload objects, preemption, fair sharing, partial admission,
admission checks, the order in which pending workloads are admitted.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from tests.kubefake.quantity import quantity
from tests.kubefake.resources import BY_KIND
from tests.kubefake.selectors import match_structured

if TYPE_CHECKING:
    from tests.kubefake.fake import KubeFake

JOBSET = BY_KIND[("jobset.x-k8s.io/v1alpha2", "JobSet")]
LOCAL_QUEUE = BY_KIND[("kueue.x-k8s.io/v1beta2", "LocalQueue")]
CLUSTER_QUEUE = BY_KIND[("kueue.x-k8s.io/v1beta2", "ClusterQueue")]
COHORT = BY_KIND[("kueue.x-k8s.io/v1beta2", "Cohort")]
FLAVOR = BY_KIND[("kueue.x-k8s.io/v1beta2", "ResourceFlavor")]
NAMESPACE = BY_KIND[("v1", "Namespace")]
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


class NotAdmittedError(Exception):
    """Kueue keeps the workload pending, for the reason given."""


def pod_requests(pod_spec: dict[str, Any]) -> dict[str, float]:
    """A pod's requests (a container's limits stand for requests it leaves out)."""
    total: dict[str, float] = {}
    for container in pod_spec.get("containers", []):
        resources = container.get("resources") or {}
        wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, value in wanted.items():
            total[name] = total.get(name, 0.0) + quantity(value)
    return total


class Kueue:
    def __init__(self, fake: KubeFake) -> None:
        self.fake = fake
        # (cluster queue, flavor, resource) -> amount in use, per admitted JobSet
        self.admitted: dict[tuple[str, str], dict[tuple[str, str, str], float]] = {}

    def usage(self, queue: str, flavor: str, resource: str) -> float:
        return sum(used.get((queue, flavor, resource), 0.0) for used in self.admitted.values())

    def _quota(self, queue: dict[str, Any], flavor: str, resource: str) -> dict[str, Any] | None:
        for group in queue["spec"].get("resourceGroups") or []:
            for entry in group.get("flavors") or []:
                if entry["name"] != flavor:
                    continue
                for quota in entry.get("resources") or []:
                    if quota["name"] == resource:
                        return quota
        return None

    def _cohort_spare(self, queue: dict[str, Any], flavor: str, resource: str) -> float:
        """What the cohort's other ClusterQueues leave unused of a flavor's resource (each up
        to its lendingLimit), less what they borrow themselves."""
        cohort = queue["spec"].get("cohortName")
        spare = 0.0
        for other in self.fake.store.list(CLUSTER_QUEUE)[0]:
            if other["metadata"]["name"] == queue["metadata"]["name"] or not cohort:
                continue
            quota = self._quota(other, flavor, resource)
            if other["spec"].get("cohortName") != cohort or quota is None:
                continue
            nominal = quantity(quota.get("nominalQuota", 0))
            limit = quantity(quota["lendingLimit"]) if "lendingLimit" in quota else nominal
            used = self.usage(other["metadata"]["name"], flavor, resource)
            spare += max(0.0, min(limit, nominal - used)) - max(0.0, used - nominal)
        # Quota held by the Cohort object itself is lent to its member ClusterQueues (the
        # Cohort CRD's spec.resourceGroups, schemas/kueue/kueue.x-k8s.io_cohorts.yaml);
        # what members borrow is subtracted above.
        own = self.fake.store.get(COHORT, "", cohort) if cohort else None
        if own is not None:
            quota = self._quota(own, flavor, resource)
            if quota is not None:
                spare += quantity(quota.get("nominalQuota", 0))
        return spare

    def _fits(self, queue: dict[str, Any], flavor: str, resource: str, amount: float) -> bool:
        quota = self._quota(queue, flavor, resource)
        if quota is None:
            return False
        nominal = quantity(quota.get("nominalQuota", 0))
        need = self.usage(queue["metadata"]["name"], flavor, resource) + amount
        if need <= nominal:
            return True
        if not queue["spec"].get("cohortName"):
            return False
        if "borrowingLimit" in quota and need > nominal + quantity(quota["borrowingLimit"]):
            return False
        return need - nominal <= self._cohort_spare(queue, flavor, resource)

    def _cluster_queue(self, js: dict[str, Any]) -> dict[str, Any]:
        meta = js["metadata"]
        local_name = (meta.get("labels") or {}).get(QUEUE_LABEL)
        local = self.fake.store.get(LOCAL_QUEUE, meta["namespace"], local_name or "")
        if local is None:
            raise NotAdmittedError(f"LocalQueue {local_name} doesn't exist")
        queue = self.fake.store.get(CLUSTER_QUEUE, "", local["spec"]["clusterQueue"])
        if queue is None:
            raise NotAdmittedError(f"ClusterQueue {local['spec']['clusterQueue']} doesn't exist")
        namespace = self.fake.store.get(NAMESPACE, "", meta["namespace"]) or {"metadata": {}}
        # A ClusterQueue without a namespaceSelector admits no namespace (cluster_queue.md).
        selector = queue["spec"].get("namespaceSelector")
        if selector is None or not match_structured(selector, namespace["metadata"].get("labels")):
            raise NotAdmittedError(
                f"ClusterQueue {queue['metadata']['name']} does not admit workloads from "
                f"namespace {meta['namespace']}"
            )
        return queue

    def admit(self, namespace: str, name: str) -> dict[str, str]:
        """Admit a suspended JobSet by quota: the flavor given to each resource, or
        NotAdmittedError with Kueue's reason."""
        with self.fake.lock:
            js = self.fake.store.get(JOBSET, namespace, name)
            if js is None:
                raise KeyError(f"no JobSet {namespace}/{name}")
            queue = self._cluster_queue(js)
            cq = queue["metadata"]["name"]
            usage: dict[tuple[str, str, str], float] = {}
            chosen: dict[str, str] = {}
            updated = copy.deepcopy(js)
            for rjob in updated["spec"]["replicatedJobs"]:
                job = rjob["template"]["spec"]
                pods = rjob.get("replicas", 1) * min(
                    job.get("parallelism") or 1,
                    job.get("completions") or job.get("parallelism") or 1,
                )
                wanted = {k: v * pods for k, v in pod_requests(job["template"]["spec"]).items()}
                template = job["template"]["spec"]
                for group in queue["spec"].get("resourceGroups") or []:
                    covered = [r for r in group["coveredResources"] if r in wanted]
                    if not covered:
                        continue
                    flavor = next(
                        (
                            f["name"]
                            for f in group["flavors"]
                            if all(self._fits(queue, f["name"], r, wanted[r]) for r in covered)
                        ),
                        None,
                    )
                    if flavor is None:
                        raise NotAdmittedError(
                            f"couldn't assign flavors to pod set {rjob['name']}: insufficient "
                            f"quota for {', '.join(covered)} in ClusterQueue {cq}"
                        )
                    for resource in covered:
                        usage[(cq, flavor, resource)] = wanted[resource]
                        chosen[resource] = flavor
                    self._merge(template, flavor)
                missing = set(wanted) - set(chosen)
                if missing:
                    raise NotAdmittedError(
                        f"resource {sorted(missing)[0]} unavailable in ClusterQueue {cq}"
                    )
            self.admitted[(namespace, name)] = usage
            updated["spec"]["suspend"] = False
            self.fake.internal_update(updated)
            return chosen

    def _merge(self, pod_spec: dict[str, Any], flavor_name: str) -> None:
        """podset.Merge: the flavor's nodeLabels join the nodeSelector (a conflicting value is
        an error) and its tolerations join the pod's."""
        flavor = self.fake.store.get(FLAVOR, "", flavor_name)
        if flavor is None:
            raise NotAdmittedError(f"ResourceFlavor {flavor_name} doesn't exist")
        selector = pod_spec.setdefault("nodeSelector", {})
        for key, value in (flavor["spec"].get("nodeLabels") or {}).items():
            if selector.get(key, value) != value:
                raise NotAdmittedError(
                    f"conflict for nodeSelector {key}: {selector[key]} vs {value}"
                )
            selector[key] = value
        tolerations = pod_spec.setdefault("tolerations", [])
        for toleration in flavor["spec"].get("tolerations") or []:
            if toleration not in tolerations:
                tolerations.append(copy.deepcopy(toleration))

    def release(self, js: dict[str, Any]) -> None:
        self.admitted.pop((js["metadata"]["namespace"], js["metadata"]["name"]), None)
