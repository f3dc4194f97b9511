"""The broker's side of a Volcano gang's stop count (``tideflow.kube.volcano_lineage``).

Before it evicts a gang's pods the broker adds one to the gang's Job's
``tideflow.io/broker-stops``; at every step it reads each gang's stops by anything
else (its aborts less the broker's), which the journal counts against the lost-work
budget as it counts Kueue's preemptions (``DecisionJournal.record_preemptions``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tideflow.broker.journal import PreemptionCount
from tideflow.kube import volcano_lineage
from tideflow.kube.client import MERGE
from tideflow.kube.volcano import GANG_LABEL

log = logging.getLogger(__name__)
JOBS = ("batch.volcano.sh", "v1alpha1")
# A stop the broker makes aborts the Job only from these phases: pending.go and
# running.go turn PodEvicted's AbortJob into Aborting; restarting.go and the finishing
# phases ignore it, and an aborting Job is already counted.
STOPPABLE = ("Pending", "Running")
# Optimistic-concurrency retries of the count (another writer moved the Job meanwhile).
ATTEMPTS = 5


class VolcanoStops:
    def __init__(self, custom: Any, namespace: str, spec_gpus: Callable[[dict[str, Any]], int]):
        """``spec_gpus``: the GPUs a pod with a given spec holds (its effective request)."""
        self.custom = custom
        self.namespace = namespace
        self.spec_gpus = spec_gpus

    def _jobs(self, selector: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.custom.list_namespaced_custom_object(
            *JOBS, self.namespace, "jobs", label_selector=selector
        )["items"]
        return items

    def _gpus(self, job: dict[str, Any]) -> int:
        """What one stop of the gang stops: each task's replicas at its pods' GPUs."""
        return sum(
            int(task.get("replicas", 0))
            * self.spec_gpus((task.get("template") or {}).get("spec") or {})
            for task in (job.get("spec") or {}).get("tasks") or []
        )

    def counts(self) -> tuple[PreemptionCount, ...] | None:
        """Each gang's stops by anything but the broker, keyed by its lineage; None
        where the Jobs cannot be read (a Role from before they were listed), logged."""
        from kubernetes.client.rest import ApiException

        try:
            jobs = self._jobs(GANG_LABEL)
        except ApiException as exc:
            log.warning(
                "broker: cannot list Volcano Jobs in %s (%s %s): their preemptions are not "
                "counted this step (re-apply deploy/kubernetes/broker-rbac.yaml)",
                self.namespace,
                exc.status,
                exc.reason,
            )
            return None
        counts = []
        for job in jobs:
            try:
                gpus = self._gpus(job)
            except ValueError:
                log.warning(
                    "broker: Volcano Job %s asks for a GPU amount that is not a whole number: "
                    "its preemptions are not counted",
                    job["metadata"].get("name"),
                )
                continue
            uid, created_s = volcano_lineage.lineage(job)
            counts.append(
                PreemptionCount(uid, volcano_lineage.stops_by_others(job), gpus, created_s)
            )
        return tuple(counts)

    def note(self, gang: str, change: int) -> bool:
        """Add ``change`` to the broker's stops of the gang labelled ``gang``, on its Job
        if it has one that a stop would abort (``STOPPABLE``); whether it was written.
        Written with the Job's resourceVersion, so a Job that began aborting meanwhile
        is read again and left alone. A refusal is logged: the stop then also counts as
        one by others, against the budget twice rather than not at all."""
        from kubernetes.client.rest import ApiException

        for _ in range(ATTEMPTS):
            try:
                jobs = self._jobs(f"{GANG_LABEL}={gang}")
                if len(jobs) != 1 or volcano_lineage.phase(jobs[0]) not in STOPPABLE:
                    return False
                job = jobs[0]
                stops = max(0, volcano_lineage.broker_stops(job) + change)
                self.custom.patch_namespaced_custom_object(
                    *JOBS,
                    self.namespace,
                    "jobs",
                    job["metadata"]["name"],
                    {
                        "metadata": {
                            "resourceVersion": job["metadata"]["resourceVersion"],
                            "annotations": {volcano_lineage.BROKER_STOPS: str(stops)},
                        }
                    },
                    _content_type=MERGE,
                )
                return True
            except ApiException as exc:
                if exc.status == 409:  # changed since it was read: read it again
                    continue
                log.warning(
                    "broker: cannot count its stop of gang %s on its Volcano Job (%s %s): "
                    "the stop counts against the lost-work budget twice (re-apply "
                    "deploy/kubernetes/broker-rbac.yaml)",
                    gang,
                    exc.status,
                    exc.reason,
                )
                return False
        log.warning(
            "broker: gang %s's Volcano Job kept changing: its stop count is as it was", gang
        )
        return False
