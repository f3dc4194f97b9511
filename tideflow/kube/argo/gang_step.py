"""A gang_training step: a ``resource`` template that creates the step's Volcano Job.

The workflow owns the Job (deleting the workflow deletes the gang) and waits
for Volcano's verdict on the whole gang (``SUCCESS`` / ``FAILURE``). Argo
substitutes ``{{...}}`` in the manifest text before it creates the object, so
the gang's size may be a workflow parameter; integer fields are written
unquoted for that reason (``ArgoInt``). A gang needs a command entry point, as
on the Kubernetes backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tideflow.checkpoint.policy import checkpoint_env
from tideflow.compile.dag_plan import TaskPlan
from tideflow.compile.templates import exact_param
from tideflow.kube.argo.context import CompileContext
from tideflow.kube.argo.manifest import ArgoInt, manifest_yaml
from tideflow.kube.argo.plan import FAILURE, RETRY_NUMBER, SUCCESS, WORKFLOW_NAME, StepTemplate
from tideflow.kube.argo.templating import checkpoint_store_of, step_env, translate_tree
from tideflow.kube.names import dns_label
from tideflow.kube.pods import DEVICE_RESOURCES, placement, restricted_pod
from tideflow.kube.volcano import GangShape, gang_volcano_job
from tideflow.spec.yamlpos import Path


@dataclass(frozen=True)
class Sized:
    """A size of the gang: its default, and the workflow parameter that sets it, if one does."""

    default: int
    expression: str | None  # the workflow parameter that sets it, when templated


def sized(ctx: CompileContext, value: int | str, path: Path) -> Sized:
    """A gang size: an integer, or exactly one int param (Argo fills the number in)."""
    if isinstance(value, int):
        return Sized(value, None)
    name = exact_param(value)
    spec = ctx.spec.params.get(name or "")
    if spec is not None and spec.type == "int":
        return Sized(int(spec.default), f"{{{{workflow.parameters.{name}}}}}")
    ctx.issue(
        path,
        f"'{value}' cannot size a gang object",
        "an integer, or '{{ params.NAME }}' of an int param",
    )
    return Sized(1, None)


def gang_step(ctx: CompileContext, index: int, task: TaskPlan) -> StepTemplate | None:
    config = task.config
    base: Path = ("steps", index, "gang_training")
    entrypoint = config["entrypoint"]
    if isinstance(entrypoint, str):
        ctx.issue(
            (*base, "entrypoint"),
            f"entry point '{entrypoint}' is module:function; a gang on Kubernetes runs "
            "a command in each worker",
            "a command as a list, such as [python, -m, my.train, --lr, '{{ params.lr }}']",
        )
        return None
    inputs: dict[str, str] = {}
    command = [
        str(translate_tree(ctx, part, (*base, "entrypoint", i), task, inputs))
        for i, part in enumerate(entrypoint)
    ]
    workers = sized(ctx, config["workers"], (*base, "workers"))
    per_worker = sized(ctx, config["devices_per_worker"], (*base, "devices_per_worker"))
    restarts = sized(ctx, config["max_restarts"], (*base, "max_restarts"))
    checkpoint = translate_tree(ctx, config["checkpoint"], (*base, "checkpoint"), task, inputs)
    gang_id = f"{ctx.plan.dag_id}/{WORKFLOW_NAME}/{task.task_id}"
    env = {
        **checkpoint_env(checkpoint, checkpoint_store_of(ctx, task, index)),
        "TIDEFLOW_GANG_ID": gang_id,
        "MLFLOW_TRACKING_URI": ctx.settings.mlflow_tracking_uri,
        # No operator makes this step's MLflow run: rank 0 finds or makes it
        # under the workflow's pipeline run (tideflow.runtime.metrics).
        "TIDEFLOW_PIPELINE": ctx.plan.dag_id,
        "TIDEFLOW_TEAM": ctx.plan.team,
        "TIDEFLOW_RUN_ID": WORKFLOW_NAME,
        "TIDEFLOW_STEP": task.task_id,
        **step_env(ctx, task, base, inputs),
    }
    # One Volcano Job per attempt: a retry creates a fresh one, which resumes
    # from the checkpoints the earlier attempt committed to the same store.
    gang_name = f"{WORKFLOW_NAME}-{task.task_id}"
    name = f"{gang_name}-{RETRY_NUMBER}" if task.retries else gang_name
    device = config["device"]
    shape = GangShape(
        name=name,
        labels={
            "tideflow.io/pipeline": dns_label(ctx.plan.dag_id),
            "tideflow.io/step": dns_label(task.task_id),
            "tideflow.io/run": WORKFLOW_NAME,
        },
        command=command,
        env=env,
        workers=workers.default,
        device_class=device["class"],
        devices_per_worker=per_worker.default,
        model=device.get("model"),
        team=ctx.plan.team,
        priority=int(config.get("priority", 0)),
        max_restarts=restarts.default,
    )
    job = gang_volcano_job(shape, gang_id, ctx.settings)
    fill_in(
        job,
        gang_name=gang_name,
        device_class=shape.device_class,
        workers=workers,
        per_worker=per_worker,
        restarts=restarts,
    )
    # The resource template's own pod only creates the Job and watches it.
    resource_pod = placement("cpu", ctx.settings).apply({"securityContext": restricted_pod()})
    return StepTemplate(
        name=task.task_id,
        kind=task.kind,
        dependencies=task.upstream,
        arguments=dict(sorted(inputs.items())),
        outputs=(),
        retries=task.retries,
        timeout_seconds=task.timeout_seconds,
        # No MLflow client label: this pod never talks to MLflow, so MLflow's policy keeps it out.
        labels=ctx.labels(task),
        pod=resource_pod,
        manifest=manifest_yaml(job),
        success_condition=SUCCESS,
        failure_condition=FAILURE,
    )


def fill_in(
    job: dict[str, Any],
    *,
    gang_name: str,
    device_class: str,
    workers: Sized,
    per_worker: Sized,
    restarts: Sized,
) -> None:
    """What only the workflow run knows: its gang label, and sizes set by parameters."""
    spec = job["spec"]
    (worker,) = spec["tasks"]
    # The broker groups pods into gangs by this label: one value per workflow run.
    for labels in (job["metadata"]["labels"], worker["template"]["metadata"]["labels"]):
        labels["tideflow.io/gang"] = gang_name
    pod = worker["template"]["spec"]
    (container,) = pod["containers"]
    if workers.expression:
        spec["minAvailable"] = ArgoInt(workers.expression)
        worker["replicas"] = ArgoInt(workers.expression)
        for variable in container["env"]:
            if variable["name"] == "WORLD_SIZE":
                variable["value"] = workers.expression
    if restarts.expression:  # maxRetry is one more than the restarts (volcano_max_retry)
        parameter = restarts.expression.removeprefix("{{").removesuffix("}}")
        spec["maxRetry"] = ArgoInt(f"{{{{=asInt({parameter}) + 1}}}}")
    if per_worker.expression:
        resource = DEVICE_RESOURCES.get(device_class, "cpu")
        for section in container["resources"].values():
            if resource in section:
                section[resource] = per_worker.expression
