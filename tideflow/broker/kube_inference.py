"""The inference Deployment, sized to the GPUs its pool holds, and off the nodes it gave back.

The Deployment is scaled to what its pool holds, or, when an HPA manages it, the
HPA's bounds are moved instead of the replica count. Scaling down, the ReplicaSet
deletes the pods of its own choosing (its newest first), not those on the nodes
given back to training: the replicas still there are evicted (the Eviction API, so
inference's PodDisruptionBudget holds) and the ReplicaSet replaces them on the
inference pool, which their node selector and the pool's taint keep them to.
"""

from __future__ import annotations

from typing import Any

from tideflow.broker.kube_evictions import Evictor, PodEvictions
from tideflow.broker.kube_target import ClusterTarget
from tideflow.kube.client import MERGE


class InferenceService:
    def __init__(self, apps: Any, autoscaling: Any, target: ClusterTarget) -> None:
        self.apps = apps
        self.autoscaling = autoscaling
        self.target = target

    def scale(self, gpus: int) -> None:
        replicas = gpus // self.target.gpus_per_replica
        if self.target.hpa:
            self.autoscaling.patch_namespaced_horizontal_pod_autoscaler(
                self.target.hpa,
                self.target.namespace,
                {"spec": {"minReplicas": max(1, replicas), "maxReplicas": max(1, replicas)}},
                _content_type=MERGE,
            )
        else:
            self.apps.patch_namespaced_deployment_scale(
                self.target.inference_deployment,
                self.target.namespace,
                {"spec": {"replicas": replicas}},
                _content_type=MERGE,
            )

    def replicas_on(self, nodes: set[str], core: Any) -> list[Any]:
        """The Deployment's live pods on ``nodes``, by the selector its scale reports."""
        scale = self.apps.read_namespaced_deployment_scale(
            self.target.inference_deployment, self.target.namespace
        )
        selector = scale.status.selector if scale.status is not None else None
        if not selector:
            return []
        pods = core.list_namespaced_pod(self.target.namespace, label_selector=selector).items
        return [
            p
            for p in pods
            if p.spec.node_name in nodes
            and p.metadata.deletion_timestamp is None
            and p.status.phase in ("Pending", "Running")
        ]

    def vacate(self, nodes: set[str], evictor: Evictor, deadline: float) -> PodEvictions:
        """Evict the replicas left on ``nodes`` (given back to training), a PDB's refusal
        retried until ``deadline``; each pod keeps its own termination grace."""
        done = PodEvictions()
        if nodes:
            evictor.evict_pods(self.replicas_on(nodes, evictor.core), deadline, None, done)
        return done
