"""A gang step as a Volcano Job: all workers or none (``minAvailable`` = workers).

* ``queue`` is the team; ``priorityClassName`` maps the step's priority.
* Policies: an evicted or failed pod restarts the whole gang from its newest
  checkpoint (``RestartJob``, at most ``max_restarts`` times); exit 75 (preempted
  after a checkpoint) restarts it too; exit 76 (the training-health guard)
  stops it without retrying; the job completes when the workers do.
* The ``svc`` and ``env`` plugins give rendezvous: worker 0's stable host name is
  ``MASTER_ADDR``, and each worker's index (``VC_TASK_INDEX``) is its rank.
* Pods meet the "restricted" Pod Security Standard, get a termination grace
  long enough to write a checkpoint, and read store credentials from a Secret.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tideflow.compile.dag_plan import DagPlan, TaskPlan
from tideflow.kube.names import dns_label

DEVICE_RESOURCES = {"gpu": "nvidia.com/gpu", "npu": "huawei.com/Ascend910"}
MODEL_LABELS = {"gpu": "nvidia.com/gpu.product", "npu": "accelerator/huawei-npu"}
EXIT_PREEMPTED, EXIT_UNHEALTHY = 75, 76


@dataclass(frozen=True)
class KubeSettings:
    namespace: str = "tideflow"
    image: str = "registry.example.com/tideflow:0.1.0"
    store_secret: str = "tideflow-store"  # S3 credentials (or use IRSA: leave it empty)
    mlflow_tracking_uri: str = "http://mlflow.tideflow:5000"
    artifact_root: str = "s3://tideflow/artifacts"
    termination_grace_s: int = 300
    master_port: int = 29500
    priority_classes: tuple[tuple[int, str], ...] = (
        (1, "tideflow-training-high"),
        (0, "tideflow-training"),
        (-(10**9), "tideflow-spare"),
    )

    def priority_class(self, priority: int) -> str:
        return next(name for floor, name in self.priority_classes if priority >= floor)


def _restricted() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def volcano_job(
    plan: DagPlan, task: TaskPlan, *, run_id: str, settings: KubeSettings
) -> dict[str, Any]:
    if task.kind != "gang_training":
        raise ValueError(f"step {task.task_id!r} is {task.kind}, not gang_training")
    config = task.config
    workers = config["workers"]
    if not isinstance(workers, int):
        raise ValueError(
            f"step {task.task_id!r}: workers is {workers!r}; a Volcano Job needs a number "
            "(render the run's params first)"
        )
    device = config["device"]
    per_worker = int(config["devices_per_worker"])
    name = dns_label(plan.dag_id, task.task_id, run_id, limit=47)  # room for "-worker-NNN"
    gang_id = f"{plan.dag_id}/{run_id}/{task.task_id}"
    labels = {
        "tideflow.io/pipeline": dns_label(plan.dag_id),
        "tideflow.io/step": dns_label(task.task_id),
        "tideflow.io/run": dns_label(run_id),
        "tideflow.io/gang": dns_label(gang_id),
        "tideflow.io/team": dns_label(plan.team),
    }
    resources: dict[str, dict[str, str]] = {"requests": {}, "limits": {}}
    resource = DEVICE_RESOURCES.get(device["class"])
    if resource:
        resources["requests"][resource] = resources["limits"][resource] = str(per_worker)
    else:
        resources["requests"]["cpu"] = str(per_worker)
    entrypoint = config["entrypoint"]
    if not isinstance(entrypoint, list):
        raise ValueError(
            f"step {task.task_id!r}: entry point {entrypoint!r} is module:function; on "
            "Kubernetes a gang step needs a command entry point (a list) for now"
        )
    command = [str(part) for part in entrypoint]
    store = (config.get("checkpoint") or {}).get("store") or (
        f"{settings.artifact_root}/{plan.dag_id}/{dns_label(run_id)}/{task.task_id}/checkpoints"
    )
    env = [
        {"name": "WORLD_SIZE", "value": str(workers)},
        {"name": "MASTER_ADDR", "value": f"{name}-worker-0.{name}"},
        {"name": "MASTER_PORT", "value": str(settings.master_port)},
        {"name": "TIDEFLOW_DEVICE_CLASS", "value": device["class"]},
        {"name": "TIDEFLOW_CHECKPOINT_URI", "value": store},
        {"name": "TIDEFLOW_GANG_ID", "value": gang_id},
        {"name": "MLFLOW_TRACKING_URI", "value": settings.mlflow_tracking_uri},
        *({"name": k, "value": str(v)} for k, v in sorted((config.get("env") or {}).items())),
    ]
    container: dict[str, Any] = {
        "name": "worker",
        "image": settings.image,
        "command": command,
        "env": env,
        "resources": resources,
        "securityContext": _restricted(),
        "ports": [{"name": "rendezvous", "containerPort": settings.master_port}],
    }
    if settings.store_secret:
        container["envFrom"] = [{"secretRef": {"name": settings.store_secret}}]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # the Job's policies restart the whole gang, never one pod
        "terminationGracePeriodSeconds": settings.termination_grace_s,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
    }
    if device.get("model") and device["class"] in MODEL_LABELS:
        pod_spec["nodeSelector"] = {MODEL_LABELS[device["class"]]: device["model"]}
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": labels},
        "spec": {
            "schedulerName": "volcano",
            "minAvailable": workers,
            "queue": dns_label(plan.team),
            "priorityClassName": settings.priority_class(int(config.get("priority", 0))),
            "maxRetry": int(config.get("max_restarts", 0)),
            "plugins": {"svc": [], "env": []},
            "policies": [
                {"event": "PodEvicted", "action": "RestartJob"},
                {"event": "PodFailed", "action": "RestartJob"},
                {"exitCode": EXIT_PREEMPTED, "action": "RestartJob"},
                {"exitCode": EXIT_UNHEALTHY, "action": "TerminateJob"},
                {"event": "TaskCompleted", "action": "CompleteJob"},
            ],
            "tasks": [
                {
                    "name": "worker",
                    "replicas": workers,
                    "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
                }
            ],
        },
    }
