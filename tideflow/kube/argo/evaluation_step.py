"""An evaluation step: the executor on one device kind, reading the gang's checkpoint store.

The device is decided here, at compile time: the first of the step's
preferences that the cluster inventory has, or the first (a known limit: not
whichever is free when the step starts). The executor evaluates the checkpoint
the step's ``checkpoint`` names: the best by the gang step's ``keep_best``
(given here, from the plan), or the latest.
"""

from __future__ import annotations

from tideflow.compile.dag_plan import TaskPlan
from tideflow.kube.argo.container import STEP_CPU, STEP_MEMORY, container_step, executor_args
from tideflow.kube.argo.context import CompileContext
from tideflow.kube.argo.plan import StepTemplate
from tideflow.kube.argo.templating import output_of, step_env
from tideflow.kube.pods import evaluation_device, placement
from tideflow.spec.yamlpos import Path


def evaluation_step(ctx: CompileContext, index: int, task: TaskPlan) -> StepTemplate:
    config = task.config
    base: Path = ("steps", index, "evaluation")
    where = evaluation_device(tuple(config["devices"]), ctx.inventory)
    place = placement(where, ctx.settings)
    inputs: dict[str, str] = {}
    extra = ["--device", where]
    gang = task.sources.get("checkpoint")
    if gang is not None:
        extra += ["--checkpoint-store", output_of(gang, "checkpoint_store", inputs)]
    doc = {k: config[k] for k in ("entrypoint", "args", "metrics", "checkpoint")}
    # checkpoint: best ranks the gang's checkpoints by its keep_best metric
    doc["keep_best"] = ctx.plan.keep_best_of(task)
    args = executor_args(ctx, task, doc, base, inputs, extra=extra)
    env = {
        **ctx.code_env(step_env(ctx, task, base, inputs)),
        "TIDEFLOW_DEVICE_CLASS": place.device_class,
        "TIDEFLOW_EMULATED": "0",
    }
    devices = place.device_resources()
    return container_step(
        ctx,
        task,
        inputs,
        args,
        where=where,
        env=env,
        requests={"cpu": STEP_CPU, "memory": STEP_MEMORY, **devices},
        limits={"memory": STEP_MEMORY, **devices},
        outputs=ctx.outputs_of(task),
        image=task.image,
    )
