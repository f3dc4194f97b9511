"""Stopping pods through the Eviction API, so that PodDisruptionBudgets hold.

Each pod gets its termination grace, in which tideflow's runtime writes a
checkpoint and exits resumable. A PDB's refusal (HTTP 429) is retried until the
deadline the caller gives; what a PDB still refuses then is left running.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tideflow.broker.kube_pools import NodePools
from tideflow.broker.volcano_stops import VolcanoStops
from tideflow.steps.context import GANG_LABEL


@dataclass
class PodEvictions:
    """What evicting gangs did: the pods evicted and their GPUs, the pods a PDB kept
    past the deadline and the nodes they still run on."""

    evicted: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    gpus: int = 0
    kept_on: set[str] = field(default_factory=set)

    def add(self, other: PodEvictions) -> None:
        self.evicted += other.evicted
        self.refused += other.refused
        self.gpus += other.gpus
        self.kept_on |= other.kept_on


class Evictor:
    def __init__(
        self,
        pools: NodePools,
        volcano: VolcanoStops | None,
        *,
        retry_s: float,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        self.pools = pools
        self.core = pools.core
        self.namespace = pools.target.namespace
        self.volcano = volcano
        self.retry_s = retry_s
        self.clock = clock
        self.sleep = sleep

    def evict_gang(
        self, gang_id: str, deadline: float, grace_s: float | None = None
    ) -> PodEvictions:
        """Evict the gang's pods, retrying a PDB's refusal until ``deadline``; with
        ``grace_s``, its pods get that long to stop (the Eviction's DeleteOptions), else
        their own terminationGracePeriodSeconds."""
        from kubernetes import client

        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{GANG_LABEL}={gang_id}"
        ).items
        options = (
            None if grace_s is None else client.V1DeleteOptions(grace_period_seconds=int(grace_s))
        )
        # Mark the stop on the gang's Volcano Job before the eviction can abort it (the
        # Job that replaces it counts the abort as the broker's then), and take the mark
        # back if no pod went, whatever happened meanwhile.
        marked = self.volcano.mark(gang_id) if pods and self.volcano is not None else None
        done = PodEvictions()
        try:
            self.evict_pods(pods, deadline, options, done)
        finally:
            if marked is not None and not done.evicted and self.volcano is not None:
                self.volcano.unmark(gang_id, marked)
        return done

    def evict_pods(
        self, pods: list[Any], deadline: float, options: Any, done: PodEvictions
    ) -> None:
        for pod in pods:
            self._evict_pod(pod, deadline, options, done)

    def _evict_pod(self, pod: Any, deadline: float, options: Any, done: PodEvictions) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        name = pod.metadata.name
        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=name, namespace=self.namespace),
            delete_options=options,
        )
        while True:
            try:
                self.core.create_namespaced_pod_eviction(name, self.namespace, body)
                done.evicted.append(name)
                done.gpus += self.pools.pod_gpus(pod)
                return
            except ApiException as exc:
                if exc.status == 404:  # already gone
                    return
                if exc.status != 429 or self.clock() >= deadline:
                    if exc.status == 429:
                        done.refused.append(name)  # the PDB still says no: leave it
                        done.kept_on.add(pod.spec.node_name)
                        return
                    raise
                self.sleep(self.retry_s)  # a PDB refuses for now: try again
