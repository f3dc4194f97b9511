"""How often Kueue has preempted each training gang, from its Workloads."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from tideflow.broker.journal import PreemptionCount
from tideflow.broker.kube_target import KUEUE_PREEMPTED, ClusterTarget
from tideflow.steps.context import GANG_LABEL

log = logging.getLogger("tideflow.broker.kubernetes")


def gang_pod_sets(workload: dict[str, Any]) -> list[dict[str, Any]]:
    """A Workload's pod sets whose pod template is labelled as a tideflow gang's."""
    return [
        pod_set
        for pod_set in workload.get("spec", {}).get("podSets", [])
        if GANG_LABEL in ((pod_set.get("template", {}).get("metadata") or {}).get("labels") or {})
    ]


def gang_gpus(workload: dict[str, Any], spec_gpus: Callable[[dict[str, Any]], int]) -> int:
    """The GPUs a Workload's gang pod sets hold (0: no tideflow gang's): each pod's
    effective request, for the pods not yet finished. Those that finished are
    ``status.reclaimablePods`` (per pod set, a count of pods) and hold nothing; for
    tideflow's JobSets, one replicated Job of all the workers, Kueue's JobSet
    integration reports all or none of them (its ReclaimablePods counts succeeded
    replicated Jobs), other integrations part of a pod set."""
    finished = {
        entry.get("name"): int(entry.get("count", 0))
        for entry in (workload.get("status") or {}).get("reclaimablePods") or []
    }
    return sum(
        max(0, int(pod_set.get("count", 1)) - finished.get(pod_set.get("name"), 0))
        * spec_gpus(pod_set.get("template", {}).get("spec", {}))
        for pod_set in gang_pod_sets(workload)
    )


def kueue_preemption_counts(
    custom: Any, target: ClusterTarget, spec_gpus: Callable[[dict[str, Any]], int]
) -> tuple[PreemptionCount, ...] | None:
    """How often Kueue has preempted each training gang's Workload (pod sets labelled
    ``tideflow.io/gang`` asking for the broker's GPUs): its
    ``status.schedulingStats.evictions`` entries of reason ``Preempted`` (the
    reason Kueue evicts a preemptee with, in its preemption docs,
    site/content/en/docs/concepts/preemption.md; the counter is in the Workload
    CRD's v1beta2 schema). A count, not the ``Evicted`` condition, because the
    condition turns back to False when the workload is admitted again, which can
    happen between two of the broker's steps."""
    if target.queue_kind != "kueue":
        return None
    from kubernetes.client.rest import ApiException

    try:
        workloads = custom.list_namespaced_custom_object(
            "kueue.x-k8s.io", target.kueue_version, target.namespace, "workloads"
        )["items"]
    except ApiException as exc:
        log.warning(
            "broker: cannot list Kueue Workloads in %s (%s %s): Kueue's preemptions "
            "are not counted this step (re-apply deploy/kubernetes/broker-rbac.yaml)",
            target.namespace,
            exc.status,
            exc.reason,
        )
        return None
    counts = [_count(workload, spec_gpus) for workload in workloads]
    return tuple(count for count in counts if count is not None)


def _count(
    workload: dict[str, Any], spec_gpus: Callable[[dict[str, Any]], int]
) -> PreemptionCount | None:
    try:
        gpus = gang_gpus(workload, spec_gpus)
    except ValueError:
        log.warning(
            "broker: Workload %s asks for a GPU amount that is not a whole number: "
            "its preemptions are not counted",
            workload["metadata"].get("name"),
        )
        return None
    stats = (workload.get("status") or {}).get("schedulingStats") or {}
    count = sum(
        int(e.get("count", 0))
        for e in stats.get("evictions", [])
        if e.get("reason") == KUEUE_PREEMPTED
    )
    if not gang_pod_sets(workload):
        return None
    # Listed even with no GPUs held (all its workers finished): the journal
    # forgets only the workloads the queue no longer holds.
    meta = workload["metadata"]
    created = datetime.fromisoformat(meta["creationTimestamp"].replace("Z", "+00:00"))
    return PreemptionCount(meta["uid"], count, gpus, created.timestamp())
