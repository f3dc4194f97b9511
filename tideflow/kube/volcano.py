"""A gang step as a Volcano Job: all workers or none (``minAvailable`` = workers).

* ``queue`` is the team; ``priorityClassName`` is the PriorityClass ``tideflow
  compile --target volcano`` made of the gang's class in the cluster file, and for a
  gang without one maps the step's priority (``KubeSettings.priority_class``).
* Policies: exit 76 (the training-health guard) stops the gang without retrying;
  a failed pod restarts the whole gang from its newest checkpoint
  (``RestartJob``, at most ``max_restarts`` times: ``maxRetry`` is one more, as
  Volcano counts); the job completes when the workers do.
* A preemption never uses up a restart. Every Volcano action that starts the
  pods again (RestartJob, and ResumeJob after an abort) adds to
  ``status.retryCount``, which ``maxRetry`` bounds (state/running.go,
  aborting.go), so a preempted gang (an evicted pod, or a worker that stopped
  when told to: exit 75 after its checkpoint, or 143 from SIGTERM) is aborted
  instead, and the backend replaces the aborted Job with a new one carrying the
  restarts still left (``tideflow.backends.kubernetes``).
* The ``svc`` plugin gives rendezvous: worker 0's stable host name is
  ``MASTER_ADDR``. Each pod gets torchrun's environment, its ``RANK`` from the
  task index Volcano writes on it (``tideflow.kube.torchrun``); the ``env``
  plugin's ``VC_TASK_INDEX`` is the same number.
* Each worker runs in the step's image (else the platform's), asks for its
  devices and the step's per-worker CPU and memory (memory is also its limit),
  and gets the step's context and args as files (``$TIDEFLOW_STEP_CONTEXT``,
  ``$TIDEFLOW_STEP_ARGS``) made by a downward-API volume from its template's
  annotations, so the image needs no tideflow for them.
* Pods meet the "restricted" Pod Security Standard, get a termination grace
  long enough to write a checkpoint, and read store credentials from a Secret.
  They run as the gang ServiceAccount with no API token mounted, and carry the
  label that admits them to MLflow (``deploy/kubernetes/mlflow.yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tideflow.compile.cluster_names import DEVICE_RESOURCES, MODEL_LABELS
from tideflow.compile.team_queues import priority_class_name
from tideflow.kube.names import dns_label
from tideflow.kube.pods import (
    MLFLOW_CLIENT_LABELS,
    RUN_AS_USER,
    placement,
    restricted,
    store_env,
)
from tideflow.kube.settings import KubeSettings
from tideflow.kube.torchrun import VOLCANO, WorkerIndex, torchrun_env
from tideflow.steps.context import CONTEXT_ENV, OUTPUTS_ENV, gang_labels
from tideflow.steps.entrypoints import ARGS_ENV

EXIT_PREEMPTED, EXIT_UNHEALTHY = 75, 76
# A worker killed by SIGTERM's default action (128 + 15): the pod was deleted or evicted
# and its code had no handler; it is stopped from outside, not failing.
EXIT_SIGTERM = 143
# How many restarts the earlier incarnations of a replaced (preempted) gang used up.
RESTARTS_USED = "tideflow.io/restarts-used"
# The step's context files in a worker pod: annotations of the pod template, made files
# by a downward-API volume (no tideflow needed in the image to write them).
STEP_FILES_DIR = "/etc/tideflow/step"
STEP_FILES_VOLUME = "tideflow-step"
STEP_FILE_ANNOTATIONS = {
    "context.json": "tideflow.io/step-context",
    "args.json": "tideflow.io/step-args",
}
STEP_FILE_ENV = {"context.json": CONTEXT_ENV, "args.json": ARGS_ENV}
STEP_OUTPUTS_FILE = "/tmp/tideflow-step-outputs.json"  # the pod's own: one per rank


@dataclass(frozen=True)
class GangShape:
    """What a gang object (Volcano Job or JobSet) needs to know about a gang: the
    backend's projection of a ``GangJob`` (``tideflow.backends.kubernetes``)."""

    name: str
    labels: dict[str, str]
    command: list[str]
    env: dict[str, str]
    workers: int
    device_class: str
    devices_per_worker: int
    model: str | None
    team: str
    priority: int
    max_restarts: int
    # The cluster file's class (ResolvedGang.priority_class): its compiled
    # WorkloadPriorityClass or PriorityClass (``priority_class_name``) is the gang's.
    priority_class: str | None = None
    image: str | None = None  # None: the platform's (``KubeSettings.image``)
    cpu: str | None = None  # per worker, besides its devices
    memory: str | None = None
    step_files: dict[str, str] = field(default_factory=dict)  # context.json, args.json


def step_file_annotations(shape: GangShape) -> dict[str, str]:
    """The pod template's annotations that carry the step's context files."""
    return {STEP_FILE_ANNOTATIONS[name]: text for name, text in sorted(shape.step_files.items())}


def _step_files(shape: GangShape) -> tuple[list[dict[str, str]], dict[str, Any] | None]:
    """The step-context variables and the downward-API volume that makes their files."""
    if not shape.step_files:
        return [], None
    names = sorted(shape.step_files)
    env = [{"name": STEP_FILE_ENV[n], "value": f"{STEP_FILES_DIR}/{n}"} for n in names]
    env.append({"name": OUTPUTS_ENV, "value": STEP_OUTPUTS_FILE})
    items = [
        {
            "path": name,
            "fieldRef": {"fieldPath": f"metadata.annotations['{STEP_FILE_ANNOTATIONS[name]}']"},
        }
        for name in names
    ]
    return env, {"name": STEP_FILES_VOLUME, "downwardAPI": {"items": items}}


def gang_object_labels(shape: GangShape, gang_id: str) -> dict[str, str]:
    """Labels on the gang object and its pods: the job's (its step run's), then its gang
    and team (``tideflow.steps.context.gang_labels``), which the broker reads."""
    return {**shape.labels, **gang_labels(gang_id, shape.team)}


def _worker_resources(shape: GangShape) -> dict[str, dict[str, str]]:
    """A worker's requests and limits: its devices (a cpu gang's are its cores), CPU, memory."""
    resources: dict[str, dict[str, str]] = {"requests": {}, "limits": {}}
    resource = DEVICE_RESOURCES.get(shape.device_class)
    if resource:
        resources["requests"][resource] = str(shape.devices_per_worker)
        resources["limits"][resource] = str(shape.devices_per_worker)
        if shape.cpu is not None:
            resources["requests"]["cpu"] = shape.cpu
    else:  # a cpu gang's devices are its cores
        resources["requests"]["cpu"] = str(shape.devices_per_worker)
    if shape.memory is not None:
        # A CPU limit would throttle; memory is limited so one worker cannot starve a node.
        resources["requests"]["memory"] = shape.memory
        resources["limits"]["memory"] = shape.memory
    return resources


def _worker_env(
    shape: GangShape,
    settings: KubeSettings,
    files_env: list[dict[str, str]],
    *,
    master_addr: str,
    index: WorkerIndex,
    run_id: str,
) -> list[dict[str, str]]:
    """torchrun's environment, the device class, the step files', the store's, the step's."""
    return [
        *torchrun_env(
            index=index,
            workers=shape.workers,
            master_addr=master_addr,
            master_port=settings.master_port,
            max_restarts=shape.max_restarts,
            run_id=run_id,
        ),
        {"name": "TIDEFLOW_DEVICE_CLASS", "value": shape.device_class},
        *files_env,
        # Where rank 0 reports and artifacts go, unless the step's env says otherwise.
        *(variable for variable in store_env(settings) if variable["name"] not in shape.env),
        *({"name": k, "value": v} for k, v in shape.env.items()),
    ]


def _worker_container(
    shape: GangShape, settings: KubeSettings, env: list[dict[str, str]], *, mounts_files: bool
) -> dict[str, Any]:
    """The ``worker`` container: image, command, env, resources, rendezvous port, mounts."""
    container: dict[str, Any] = {
        "name": "worker",
        "image": shape.image or settings.image,
        "command": list(shape.command),
        "env": env,
        "resources": _worker_resources(shape),
        "securityContext": restricted(),
        "ports": [{"name": "rendezvous", "containerPort": settings.master_port}],
    }
    if settings.store_secret:
        container["envFrom"] = [{"secretRef": {"name": settings.store_secret}}]
    if mounts_files:
        container["volumeMounts"] = [
            {"name": STEP_FILES_VOLUME, "mountPath": STEP_FILES_DIR, "readOnly": True}
        ]
    return container


def gang_pod_spec(
    shape: GangShape,
    settings: KubeSettings,
    *,
    master_addr: str,
    index: WorkerIndex,
    run_id: str,
) -> dict[str, Any]:
    """One worker's pod: its devices, CPU and memory, torchrun's environment (the rank
    from ``index``), the step's context files, restricted security, grace to checkpoint."""
    files_env, files_volume = _step_files(shape)
    env = _worker_env(
        shape, settings, files_env, master_addr=master_addr, index=index, run_id=run_id
    )
    container = _worker_container(shape, settings, env, mounts_files=files_volume is not None)
    pod_spec: dict[str, Any] = {
        "serviceAccountName": settings.gang_service_account,
        "automountServiceAccountToken": False,  # workers never call the Kubernetes API
        "restartPolicy": "Never",  # the gang restarts whole, never one pod
        "terminationGracePeriodSeconds": settings.termination_grace_s,
        "priorityClassName": settings.priority_class(shape.priority),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
    }
    if files_volume is not None:
        pod_spec["volumes"] = [files_volume]
    if shape.model and shape.device_class in MODEL_LABELS:
        pod_spec["nodeSelector"] = {
            MODEL_LABELS[shape.device_class]: settings.model_label(shape.model)
        }
    # The gang's pool (GPU gangs: the broker's training pool) and its taint.
    return placement(shape.device_class, settings).apply(pod_spec)


def _template_metadata(shape: GangShape, labels: dict[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"labels": {**labels, **MLFLOW_CLIENT_LABELS}}
    annotations = step_file_annotations(shape)
    if annotations:
        meta["annotations"] = annotations
    return meta


def volcano_max_retry(max_restarts: int) -> int:
    """``maxRetry`` for ``max_restarts`` whole-gang restarts.

    Each RestartJob increments ``status.retryCount`` and the job fails when a restart
    finds it at ``maxRetry`` (volcano pkg/controllers/job/state/running.go,
    restarting.go; test/e2e/jobp/job_restart.go: maxRetry 2 ends at retryCount 2), so
    N allows N - 1 restarts. 0 would be defaulted to 3 by the mutating webhook
    (webhooks/admission/jobs/mutate/mutate_job.go patchDefaultMaxRetry); N + 1 is
    never 0.
    """
    return max_restarts + 1


def job_priority_class(shape: GangShape, settings: KubeSettings) -> str:
    """The Volcano Job's ``priorityClassName``: the PriorityClass compiled for the gang's
    class (``tideflow compile --target volcano``), else the one its priority maps to."""
    if shape.priority_class:
        return priority_class_name(shape.priority_class)
    return settings.priority_class(shape.priority)


def gang_volcano_job(
    shape: GangShape, gang_id: str, settings: KubeSettings, *, restarts_used: int = 0
) -> dict[str, Any]:
    """The Volcano Job for a gang of ``shape.workers`` pods, all or none.

    ``restarts_used``: restarts earlier incarnations of this gang used (it replaces a
    preempted one); the Job allows only the rest.
    """
    name = shape.name
    labels = gang_object_labels(shape, gang_id)
    pod_spec = gang_pod_spec(
        shape, settings, master_addr=f"{name}-worker-0.{name}", index=VOLCANO, run_id=gang_id
    )
    # Volcano sets the pods' priority from the Job's priorityClassName.
    pod_spec.pop("priorityClassName")
    job: dict[str, Any] = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": labels},
        "spec": {
            "schedulerName": "volcano",
            "minAvailable": shape.workers,
            "queue": dns_label(shape.team),
            "priorityClassName": job_priority_class(shape, settings),
            "maxRetry": volcano_max_retry(max(0, shape.max_restarts - restarts_used)),
            "plugins": {"svc": [], "env": []},
            # Volcano applies the first policy that matches, checking each policy's event
            # before its exit code, and a failed pod's request carries both PodFailed and
            # the exit code (volcano pkg/controllers/job/job_controller_util.go
            # applyPolicies): the exit-code policies must come first, or PodFailed ->
            # RestartJob would restart a run the health guard stopped. A preempted worker
            # exits (75 or 143) before its pod is gone, so that request comes first.
            "policies": [
                {"exitCode": EXIT_UNHEALTHY, "action": "TerminateJob"},
                {"exitCode": EXIT_PREEMPTED, "action": "AbortJob"},
                {"exitCode": EXIT_SIGTERM, "action": "AbortJob"},
                {"event": "PodEvicted", "action": "AbortJob"},
                {"event": "PodFailed", "action": "RestartJob"},
                {"event": "TaskCompleted", "action": "CompleteJob"},
            ],
            "tasks": [
                {
                    "name": "worker",
                    "replicas": shape.workers,
                    "template": {
                        "metadata": _template_metadata(shape, labels),
                        "spec": pod_spec,
                    },
                }
            ],
        },
    }
    if restarts_used:
        job["metadata"]["annotations"] = {RESTARTS_USED: str(restarts_used)}
    return job
