"""The exit handler: closes the workflow's parent MLflow run with the workflow's status.

Airflow does this in the DAG run's callbacks; on Argo it is the workflow's
``onExit`` template, which runs whether the DAG succeeded or not.
"""

from __future__ import annotations

from tideflow.compile.dag_plan import TaskPlan
from tideflow.kube.argo.container import container_step, executor_args
from tideflow.kube.argo.context import CompileContext
from tideflow.kube.argo.plan import StepTemplate


def pipeline_end_step(ctx: CompileContext, name: str) -> StepTemplate:
    task = TaskPlan(
        task_id=name,
        kind="pipeline_end",
        operator="",
        upstream=(),
        pool="",
        pool_slots=1,
        retries=2,  # MLflow briefly down should not leave the run open
        timeout_seconds=300,
        config={},
    )
    args = executor_args(
        ctx, task, {}, ("metadata",), {}, extra=["--set", "status:str={{workflow.status}}"]
    )
    return container_step(
        ctx,
        task,
        {},
        args,
        where="cpu",
        env={},
        requests={"cpu": "100m", "memory": "512Mi"},
        limits={"memory": "512Mi"},
        outputs=(),
    )
