"""A data_prep step: the executor on the step's pool, with the step's own resources."""

from __future__ import annotations

from tideflow.compile.dag_plan import POOL_FOR_CLASS, TaskPlan
from tideflow.kube.argo.container import container_step, executor_args
from tideflow.kube.argo.context import CompileContext
from tideflow.kube.argo.parameters import ARGO_NAME, ARGO_NAME_ACCEPTED
from tideflow.kube.argo.plan import StepTemplate
from tideflow.kube.argo.templating import step_env
from tideflow.spec.yamlpos import Path


def data_prep_step(ctx: CompileContext, index: int, task: TaskPlan) -> StepTemplate:
    config = task.config
    base: Path = ("steps", index, "data_prep")
    # Each output becomes an Argo output parameter of the same name.
    for position, name in enumerate(config["outputs"]):
        if not ARGO_NAME.match(name):
            ctx.issue(
                (*base, "outputs", position),
                f"output name '{name}' is not an Argo parameter name",
                ARGO_NAME_ACCEPTED,
            )
    inputs: dict[str, str] = {}
    doc = {k: config[k] for k in ("entrypoint", "args", "outputs")}
    args = executor_args(ctx, task, doc, base, inputs)
    resources = config["resources"]
    # A CPU limit would throttle; memory is limited so one step cannot starve a node.
    pool_class = {pool: cls for cls, pool in POOL_FOR_CLASS.items()}.get(config["pool"], "cpu")
    return container_step(
        ctx,
        task,
        inputs,
        args,
        where=pool_class,
        env=ctx.code_env(step_env(ctx, task, base, inputs)),
        requests={"cpu": str(resources["cpu"]), "memory": str(resources["memory"])},
        limits={"memory": str(resources["memory"])},
        outputs=tuple(config["outputs"]),
        image=task.image,
    )
