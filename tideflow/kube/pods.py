"""Pieces every tideflow pod shares: restricted security, pool placement, store settings.

* Security: every container meets the "restricted" Pod Security Standard
  (non-root, no privilege escalation, all capabilities dropped, the runtime's
  default seccomp profile).
* Placement: nodes belong to a pool through the ``tideflow.io/pool`` label,
  and pools keep other pods off with a ``NoSchedule`` taint of the same key;
  the broker moves GPU nodes between the ``inference`` and ``training`` pools
  that way (``tideflow.broker.kubernetes``). A pod selects its pool by the label
  and tolerates the pool taint whatever its value: the selector, not the
  toleration, decides where it lands.
* Evaluation on a *spare* GPU may land on a GPU node of either pool, at the
  lowest PriorityClass, so it runs on GPUs nobody uses now and is the first pod
  the scheduler preempts when training or inference wants them back.
* Store: MLflow's address and the artifact root as plain variables; S3
  credentials only by reference to a Secret, never inline. Pods that report to
  MLflow carry ``MLFLOW_CLIENT_LABEL``, the only pods its NetworkPolicy admits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tideflow.compile.cluster_names import DEVICE_RESOURCES, POOL_LABEL, POOL_TAINT
from tideflow.scheduling.preference import SPARE_PRIORITY

if TYPE_CHECKING:  # volcano builds on this module, not the reverse
    from tideflow.compile.dag_plan import TaskPlan
    from tideflow.inventory import Inventory
    from tideflow.kube.settings import KubeSettings

# What an Airflow task pod of a step asks for when the step itself names nothing.
TASK_CPU, TASK_MEMORY = "500m", "1Gi"
POOL_CLASSES = {"tideflow-cpu": "cpu", "tideflow-gpu": "gpu", "tideflow-npu": "npu"}

RUN_AS_USER = 10001
# MLflow's NetworkPolicy (deploy/kubernetes/mlflow.yaml) admits only pods labelled so:
# every pod that reports to MLflow carries it (the Helm values give it to Airflow's).
MLFLOW_CLIENT_LABEL = "tideflow.io/mlflow-client"
MLFLOW_CLIENT_LABELS = {MLFLOW_CLIENT_LABEL: "true"}

# Node pools by where a step asks to run. GPU pools are the broker's two.
POOLS: dict[str, tuple[str, ...]] = {
    "cpu": ("cpu",),
    "npu": ("npu",),
    "gpu": ("training",),
    "gpu-spare": ("training", "inference"),
}


def restricted() -> dict[str, Any]:
    """A container securityContext that meets the "restricted" Pod Security Standard."""
    return {
        "allowPrivilegeEscalation": False,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def restricted_pod() -> dict[str, Any]:
    """The pod-level securityContext that goes with ``restricted()``."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


@dataclass(frozen=True)
class Placement:
    """Where a step's pods may run: node pools, the device they request, their priority."""

    where: str  # cpu, npu, gpu or gpu-spare
    priority_class: str | None = None

    @property
    def pools(self) -> tuple[str, ...]:
        return POOLS[self.where]

    @property
    def device_class(self) -> str:
        return self.where.split("-")[0]

    def node_selector(self) -> dict[str, str] | None:
        return {POOL_LABEL: self.pools[0]} if len(self.pools) == 1 else None

    def affinity(self) -> dict[str, Any] | None:
        if len(self.pools) == 1:
            return None
        term = {
            "matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": [*self.pools]}]
        }
        return {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
            }
        }

    def tolerations(self) -> list[dict[str, str]]:
        return [{"key": POOL_TAINT, "operator": "Exists", "effect": "NoSchedule"}]

    def device_resources(self, count: int = 1) -> dict[str, str]:
        """Requests (and limits) for ``count`` devices; empty on the CPU."""
        resource = DEVICE_RESOURCES.get(self.device_class)
        return {resource: str(count)} if resource else {}

    def apply(self, pod_spec: dict[str, Any]) -> dict[str, Any]:
        """``pod_spec`` placed: pool selector merged with any it has, tolerations, priority."""
        placed = dict(pod_spec)
        selector = self.node_selector()
        if selector:
            placed["nodeSelector"] = {**(pod_spec.get("nodeSelector") or {}), **selector}
        affinity = self.affinity()
        if affinity:
            placed["affinity"] = affinity
        placed["tolerations"] = [*(pod_spec.get("tolerations") or []), *self.tolerations()]
        if self.priority_class:
            placed["priorityClassName"] = self.priority_class
        return placed


def placement(where: str, settings: KubeSettings) -> Placement:
    """The placement of a step that asks for ``where`` (cpu, npu, gpu or gpu-spare)."""
    if where not in POOLS:
        raise ValueError(f"unknown placement {where!r}: accepted: {', '.join(POOLS)}")
    spare = settings.priority_class(SPARE_PRIORITY) if where == "gpu-spare" else None
    return Placement(where, spare)


def store_env(settings: KubeSettings) -> list[dict[str, str]]:
    """Where tracking and artifacts go; credentials come from ``store_env_from`` only."""
    return [
        {"name": "MLFLOW_TRACKING_URI", "value": settings.mlflow_tracking_uri},
        {"name": "TIDEFLOW_ARTIFACT_ROOT", "value": settings.artifact_root},
    ]


def store_env_from(settings: KubeSettings) -> list[dict[str, Any]]:
    """S3 credentials by reference to the store Secret (none when the pod's identity has them)."""
    return [{"secretRef": {"name": settings.store_secret}}] if settings.store_secret else []


def evaluation_device(devices: tuple[str, ...], inventory: Inventory | None) -> str:
    """The first preference the cluster has (the CPU always), or the first when unknown.

    On a cluster the device is chosen when the pod is made, not when it runs:
    a pod requests its device, and the scheduler keeps it pending until one
    is free, so falling back at run time as the local backend does is not
    possible.
    """
    if inventory is None:
        return devices[0]
    for device in devices:
        device_class = device.split("-")[0]
        if device_class == "cpu" or inventory.total(device_class) > 0:  # type: ignore[arg-type]
            return device
    return devices[0]


def task_pod(task: TaskPlan, settings: KubeSettings, inventory: Inventory | None) -> dict[str, Any]:
    """The Airflow task pod of a step (KubernetesExecutor ``pod_override``), as plain data.

    Data prep runs on its pool with the resources it declares; an evaluation
    on the device it prefers (a spare GPU at the lowest priority, so it is
    the first pod preempted); a gang step's pod and a promotion only talk to
    APIs, on the CPU pool. The container is Airflow's ``base``, in the step's
    image when the step or the pipeline names one (it runs the task, so it has
    Airflow and tideflow as the worker image does); a gang step's pod only submits
    the gang, whose workers get the image, so it keeps Airflow's.
    """
    config = task.config
    requests = {"cpu": TASK_CPU, "memory": TASK_MEMORY}
    where = "cpu"
    if task.kind == "data_prep":
        where = POOL_CLASSES.get(config["pool"], "cpu")
        resources = config["resources"]
        requests = {"cpu": str(resources["cpu"]), "memory": str(resources["memory"])}
    elif task.kind == "evaluation":
        where = evaluation_device(tuple(config["devices"]), inventory)
    place = placement(where, settings)
    devices = place.device_resources()
    container = {
        "name": "base",
        # A CPU limit would throttle; memory is limited so one step cannot starve a node.
        "resources": {
            "requests": {**requests, **devices},
            "limits": {"memory": requests["memory"], **devices},
        },
        "env": [{"name": "TIDEFLOW_DEVICE_CLASS", "value": place.device_class}],
        "securityContext": restricted(),
    }
    if task.image and task.kind != "gang_training":
        container["image"] = task.image
    spec = place.apply({"securityContext": restricted_pod(), "containers": [container]})
    labels = {"tideflow.io/step-kind": task.kind, **MLFLOW_CLIENT_LABELS}
    return {"metadata": {"labels": labels}, "spec": spec}
