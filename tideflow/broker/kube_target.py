"""The cluster objects the broker moves, named by configuration (``TIDEFLOW_K8S_*``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from tideflow import settings_registry as registry
from tideflow.compile.cluster_names import (
    BROKER_POOL,
    DEVICE_RESOURCES,
    NAMESPACE,
    POOL_TAINT,
    TRAINING_QUEUE,
)
from tideflow.scheduling.model import DeviceClass

POOL = BROKER_POOL  # the node label value of the broker's pool in a cluster file
TAINT_KEY = POOL_TAINT
DEVICE_CLASSES: dict[str, DeviceClass] = {
    resource: cast("DeviceClass", device_class)
    for device_class, resource in DEVICE_RESOURCES.items()
}
KUEUE_PREEMPTED = "Preempted"  # the eviction reason of a Workload Kueue preempted
QUEUE_KINDS = ("volcano", "kueue")  # the gang schedulers whose training queue it moves


@dataclass(frozen=True)
class ClusterTarget:
    namespace: str = NAMESPACE
    inference_deployment: str = "inference"
    gpus_per_replica: int = 1
    hpa: str | None = None  # when set, its min/max replicas are moved, not the Deployment
    gpu_resource: str = "nvidia.com/gpu"
    node_selector: str = "nvidia.com/gpu.present=true"  # the GPU nodes the broker manages
    queue_kind: str = "volcano"  # or "kueue"
    training_queue: str = TRAINING_QUEUE  # Volcano Queue or Kueue ClusterQueue name
    kueue_flavor: str | None = None  # the ResourceFlavor whose quota moves (Kueue)
    kueue_version: str = "v1beta2"
    # The cluster file (TIDEFLOW_CLUSTER_FILE): when it declares a team ``inference``, the
    # broker keeps to that team's quota and borrowing rules (tideflow.broker.tenant).
    cluster_file: str | None = None


def target_from_env() -> ClusterTarget:
    """The cluster objects the broker moves, from ``TIDEFLOW_K8S_*`` variables
    (``ConfigError`` naming one it cannot use)."""

    def value(name: str) -> str | None:
        return registry.optional_text(name, backend="kubernetes") or None

    return ClusterTarget(
        namespace=registry.text("TIDEFLOW_K8S_NAMESPACE", backend="kubernetes"),
        inference_deployment=registry.text(
            "TIDEFLOW_K8S_INFERENCE_DEPLOYMENT", backend="kubernetes"
        ),
        gpus_per_replica=registry.whole("TIDEFLOW_K8S_GPUS_PER_REPLICA", backend="kubernetes"),
        hpa=value("TIDEFLOW_K8S_INFERENCE_HPA"),
        gpu_resource=registry.text("TIDEFLOW_K8S_GPU_RESOURCE", backend="kubernetes"),
        node_selector=registry.text("TIDEFLOW_K8S_NODE_SELECTOR", backend="kubernetes"),
        queue_kind=registry.text("TIDEFLOW_K8S_QUEUE_KIND", backend="kubernetes"),
        training_queue=registry.text("TIDEFLOW_K8S_TRAINING_QUEUE", backend="kubernetes"),
        kueue_flavor=value("TIDEFLOW_K8S_KUEUE_FLAVOR"),
        cluster_file=value("TIDEFLOW_CLUSTER_FILE"),
    )


def few(names: list[str] | tuple[str, ...], most: int = 5) -> str:
    """Up to ``most`` names, then how many more (for the broker's notes)."""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more
