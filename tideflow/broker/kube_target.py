"""The cluster objects the broker moves, named by configuration (``TIDEFLOW_K8S_*``)."""

from __future__ import annotations

from dataclasses import dataclass

from tideflow.config import bad_setting, env_number
from tideflow.scheduling.model import DeviceClass

POOL_LABEL = "tideflow.io/pool"
POOL = "training"  # the node label value of the broker's pool in a cluster file
DEVICE_CLASSES: dict[str, DeviceClass] = {"nvidia.com/gpu": "gpu", "huawei.com/Ascend910": "npu"}
TAINT_KEY = "tideflow.io/pool"
KUEUE_PREEMPTED = "Preempted"  # the eviction reason of a Workload Kueue preempted
QUEUE_KINDS = ("volcano", "kueue")  # the gang schedulers whose training queue it moves


@dataclass(frozen=True)
class ClusterTarget:
    namespace: str = "tideflow"
    inference_deployment: str = "inference"
    gpus_per_replica: int = 1
    hpa: str | None = None  # when set, its min/max replicas are moved, not the Deployment
    gpu_resource: str = "nvidia.com/gpu"
    node_selector: str = "nvidia.com/gpu.present=true"  # the GPU nodes the broker manages
    queue_kind: str = "volcano"  # or "kueue"
    training_queue: str = "training"  # Volcano Queue or Kueue ClusterQueue name
    kueue_flavor: str | None = None  # the ResourceFlavor whose quota moves (Kueue)
    kueue_version: str = "v1beta2"
    # The cluster file (TIDEFLOW_CLUSTER_FILE): when it declares a team ``inference``, the
    # broker keeps to that team's quota and borrowing rules (tideflow.broker.tenant).
    cluster_file: str | None = None


def target_from_env() -> ClusterTarget:
    """The cluster objects the broker moves, from ``TIDEFLOW_K8S_*`` variables
    (``ConfigError`` naming one it cannot use)."""
    import os

    env = os.environ.get
    kind = env("TIDEFLOW_K8S_QUEUE_KIND", "volcano")
    if kind not in QUEUE_KINDS:
        raise bad_setting("TIDEFLOW_K8S_QUEUE_KIND", kind, ", ".join(QUEUE_KINDS))
    return ClusterTarget(
        namespace=env("TIDEFLOW_K8S_NAMESPACE", "tideflow"),
        inference_deployment=env("TIDEFLOW_K8S_INFERENCE_DEPLOYMENT", "inference"),
        gpus_per_replica=int(
            env_number(
                "TIDEFLOW_K8S_GPUS_PER_REPLICA",
                "1",
                "a whole number >= 1",
                lambda v: v >= 1,
                whole=True,
            )
        ),
        hpa=env("TIDEFLOW_K8S_INFERENCE_HPA") or None,
        gpu_resource=env("TIDEFLOW_K8S_GPU_RESOURCE", "nvidia.com/gpu"),
        node_selector=env("TIDEFLOW_K8S_NODE_SELECTOR", "nvidia.com/gpu.present=true"),
        queue_kind=kind,
        training_queue=env("TIDEFLOW_K8S_TRAINING_QUEUE", "training"),
        kueue_flavor=env("TIDEFLOW_K8S_KUEUE_FLAVOR") or None,
        cluster_file=env("TIDEFLOW_CLUSTER_FILE") or None,
    )


def few(names: list[str] | tuple[str, ...], most: int = 5) -> str:
    """Up to ``most`` names, then how many more (for the broker's notes)."""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more
