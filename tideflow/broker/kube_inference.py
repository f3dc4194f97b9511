"""The inference Deployment, sized to the GPUs its pool holds.

The Deployment is scaled to what its pool holds, or, when an HPA manages it, the
HPA's bounds are moved instead of the replica count.
"""

from __future__ import annotations

from typing import Any

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
