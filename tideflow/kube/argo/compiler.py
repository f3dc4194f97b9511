"""``compile_workflow``: the whole pipeline as a ``WorkflowPlan``, every step by its kind's builder.

The DAG template (named by ``WorkflowPlan.entrypoint``) runs one task per
step, with the Airflow DAG's dependencies: both come from the same
``DagPlan``. Problems from every builder are gathered first and raised
together, so one compile names every field that has no Argo form.
"""

from __future__ import annotations

from collections.abc import Callable

from tideflow.compile.dag_plan import TaskPlan
from tideflow.inventory import Inventory
from tideflow.kube.argo.context import CompileContext
from tideflow.kube.argo.data_prep_step import data_prep_step
from tideflow.kube.argo.evaluation_step import evaluation_step
from tideflow.kube.argo.exit_step import pipeline_end_step
from tideflow.kube.argo.gang_step import gang_step
from tideflow.kube.argo.parameters import workflow_params
from tideflow.kube.argo.plan import StepTemplate, WorkflowPlan
from tideflow.kube.argo.promotion_step import promotion_step
from tideflow.kube.argo.schedule import argo_schedule
from tideflow.kube.settings import KubeSettings
from tideflow.spec.errors import SpecError
from tideflow.spec.models import PipelineSpec
from tideflow.spec.yamlpos import Positions
from tideflow.steps.context import pipeline_labels

StepBuilder = Callable[[CompileContext, int, TaskPlan], StepTemplate | None]

# A builder returns None when it recorded why the step has no Argo form.
BUILDERS: dict[str, StepBuilder] = {
    "data_prep": data_prep_step,
    "evaluation": evaluation_step,
    "promote_checkpoint": promotion_step,
    "gang_training": gang_step,
}


def compile_workflow(
    spec: PipelineSpec,
    *,
    settings: KubeSettings,
    inventory: Inventory | None = None,
    file: str = "<pipeline>",
    positions: Positions | None = None,
) -> WorkflowPlan:
    """Pure: the same spec and settings always give the same plan.

    Raises ``SpecError`` naming ``file`` and each step field that has no Argo
    form (located by ``positions`` when given), all problems at once.
    """
    ctx = CompileContext(spec, settings, inventory, file, positions or Positions())
    plan = ctx.plan
    steps = [BUILDERS[task.kind](ctx, i, task) for i, task in enumerate(plan.tasks)]
    schedule = argo_schedule(ctx)
    if ctx.issues:
        raise SpecError(ctx.file, ctx.issues)
    # The DAG and the exit handler are templates too: their names must not be a step's.
    names = {task.task_id for task in plan.tasks}
    entrypoint, exit_handler = (
        next(n for n in (base, *(f"{base}-{i}" for i in range(1, 99))) if n not in names)
        for base in ("pipeline", "pipeline-end")
    )
    annotations = {}
    if plan.description:
        annotations["workflows.argoproj.io/description"] = plan.description
    return WorkflowPlan(
        name=plan.dag_id,
        namespace=settings.namespace,
        labels=pipeline_labels(plan.dag_id, plan.team),
        annotations=annotations,
        entrypoint=entrypoint,
        params=workflow_params(spec, plan),
        steps=tuple(step for step in steps if step is not None),
        on_exit=pipeline_end_step(ctx, exit_handler),
        schedule=schedule,
        service_account=settings.argo_service_account,
        executor_service_account=settings.argo_executor_service_account,
    )
