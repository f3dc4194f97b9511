"""The broker's side of a Volcano gang's stop count (``tideflow.kube.volcano_lineage``).

Before it evicts a gang's pods the broker marks the gang's Job with its current run
(``tideflow.io/broker-stop``); at every step it reads each gang's stops by anything
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
from tideflow.steps.context import GANG_LABEL

log = logging.getLogger(__name__)
JOBS = ("batch.volcano.sh", "v1alpha1")
# A stop the broker makes aborts the Job only from these phases: pending.go and
# running.go turn PodEvicted's AbortJob into Aborting; restarting.go and the finishing
# phases ignore it, and an aborting Job is already counted.
STOPPABLE = ("Pending", "Running")
# Optimistic-concurrency retries of a mark (another writer changed the Job meanwhile).
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

    def mark(self, gang: str) -> tuple[str, str] | None:
        """Mark the Job of the gang labelled ``gang`` as stopped by the broker in its
        current run, if a stop would abort it (``STOPPABLE``): before the eviction, so
        the mark is there when the Job aborts and the Job that replaces it counts the
        abort as the broker's. The Job's name and uid, or None where none was marked.
        Written with the Job's resourceVersion: one that began aborting meanwhile is
        read again and left alone."""

        def marked(job: dict[str, Any]) -> dict[str, str | None] | None:
            if volcano_lineage.phase(job) not in STOPPABLE:
                return None
            return {volcano_lineage.BROKER_STOP_MARK: volcano_lineage.run_mark(job)}

        return self._patch(
            f"{GANG_LABEL}={gang}", None, marked, f"mark its stop on gang {gang}'s Volcano Job"
        )

    def unmark(self, gang: str, job: tuple[str, str]) -> None:
        """Take the mark back from the gang's Job (by name and uid), in any phase: its
        eviction stopped no pod, so an abort since is not the broker's. (Should the
        operator have replaced the Job meanwhile, the replacement counted the abort as
        the broker's; that needs a preemption of the same gang within the eviction's
        grace, all of whose pods a PodDisruptionBudget kept.)"""
        name, uid = job
        self._patch(
            f"{GANG_LABEL}={gang}",
            (name, uid),
            lambda _job: {volcano_lineage.BROKER_STOP_MARK: None},
            f"take back its stop mark on Volcano Job {name}",
        )

    def _patch(
        self,
        selector: str,
        only: tuple[str, str] | None,
        annotations: Callable[[dict[str, Any]], dict[str, str | None] | None],
        what: str,
    ) -> tuple[str, str] | None:
        """Merge ``annotations(job)`` into the one Job the selector (and ``only``: a name
        and uid) finds, under its resourceVersion, read again after a conflict."""
        from kubernetes.client.rest import ApiException

        for _ in range(ATTEMPTS):
            try:
                jobs = self._jobs(selector)
                if only is not None:
                    jobs = [
                        j for j in jobs if (j["metadata"]["name"], j["metadata"]["uid"]) == only
                    ]
                change = annotations(jobs[0]) if len(jobs) == 1 else None
                if change is None:
                    return None
                meta = jobs[0]["metadata"]
                self.custom.patch_namespaced_custom_object(
                    *JOBS,
                    self.namespace,
                    "jobs",
                    meta["name"],
                    {
                        "metadata": {
                            "resourceVersion": meta["resourceVersion"],
                            "annotations": change,
                        }
                    },
                    _content_type=MERGE,
                )
                return meta["name"], meta["uid"]
            except ApiException as exc:
                if exc.status == 409:  # changed since it was read: read it again
                    continue
                log.warning(
                    "broker: cannot %s (%s %s): the lost-work budget "
                    "may count this stop twice or miss a preemption (re-apply "
                    "deploy/kubernetes/broker-rbac.yaml)",
                    what,
                    exc.status,
                    exc.reason,
                )
                return None
        log.warning("broker: the Volcano Job kept changing: could not %s", what)
        return None
