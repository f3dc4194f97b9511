"""A promote_checkpoint step: the executor, given the gang's store and the evaluation's metrics."""

from __future__ import annotations

from tideflow.compile.dag_plan import TaskPlan
from tideflow.kube.argo.container import STEP_CPU, STEP_MEMORY, container_step, executor_args
from tideflow.kube.argo.context import CompileContext
from tideflow.kube.argo.plan import StepTemplate
from tideflow.kube.argo.templating import output_of
from tideflow.spec.yamlpos import Path
from tideflow.steps.evaluation import SELECTION_OUTPUT
from tideflow.steps.standalone_io import PROMOTION_OUTPUTS


def promotion_step(ctx: CompileContext, index: int, task: TaskPlan) -> StepTemplate | None:
    config = task.config
    base: Path = ("steps", index, "promote_checkpoint")
    gang, scored = task.sources.get("checkpoint"), task.sources.get("metrics")
    if gang is None or scored is None:
        ctx.issue(
            ("steps", index, "needs"),
            f"step '{task.task_id}' has no upstream "
            f"{'gang_training' if gang is None else 'evaluation'} step to promote from",
            "needs that lead (directly or through other steps) to a gang_training step "
            "and an evaluation step",
        )
        return None
    inputs: dict[str, str] = {}
    extra = [
        "--checkpoint-store",
        output_of(gang, "checkpoint_store", inputs),
        "--training-step",
        gang,
        "--metrics",
        output_of(scored, "metrics", inputs),
    ]
    if ctx.tasks[scored].sources.get("checkpoint") == gang:
        # Promote exactly the checkpoint that was evaluated, and record how it was chosen.
        extra += [
            "--checkpoint-step",
            output_of(scored, "checkpoint_step", inputs),
            "--checkpoint-selection",
            output_of(scored, SELECTION_OUTPUT, inputs),
        ]
    doc = {k: config[k] for k in ("model", "alias", "gate", "builder", "args")}
    args = executor_args(ctx, task, doc, base, inputs, extra=extra)
    return container_step(
        ctx,
        task,
        inputs,
        args,
        where="cpu",
        env=ctx.code_env({}),  # the builder imports the pipeline's modules
        requests={"cpu": STEP_CPU, "memory": STEP_MEMORY},
        limits={"memory": STEP_MEMORY},
        outputs=PROMOTION_OUTPUTS,
        image=task.image,
    )
