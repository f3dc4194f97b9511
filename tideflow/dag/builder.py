"""Instantiate an Airflow DAG from a ``DagPlan``. Decisions belong in the plan, not here."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Param

from tideflow import operators  # mapped from operators/
from tideflow.compile.dag_plan import DagPlan, TaskPlan
from tideflow.operators.callbacks import (
    pipeline_run_failed,
    pipeline_run_succeeded,
)

# A fixed start date in the past: pipelines with a schedule start from their
# first deployment (catchup is off), and manual-only pipelines ignore it.
START_DATE = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def _operator_kwargs(task: TaskPlan, plan: DagPlan) -> dict[str, Any]:
    if task.kind == "data_prep":
        config = task.config
        return {
            "entrypoint": config["entrypoint"],
            "args": config.get("args", {}),
            "env": config.get("env", {}),
            "outputs": tuple(config.get("outputs", ())),
        }
    if task.gang is not None:  # the operator takes the step's typed plan whole
        return {"plan": task.gang}
    if task.kind == "evaluation":
        config = task.config
        return {
            "entrypoint": config["entrypoint"],
            "args": config.get("args", {}),
            "env": config.get("env", {}),
            "devices": tuple(config["devices"]),
            "metrics": tuple(config["metrics"]),
            "sources": task.sources,
            "checkpoint": config["checkpoint"],
            "keep_best": plan.keep_best_of(task),
        }
    if task.kind == "promote_checkpoint":
        config = task.config
        return {
            "model": config["model"],
            "alias": config["alias"],
            "gate": config["gate"],
            "builder": config.get("builder"),
            "args": config.get("args", {}),
            "sources": task.sources,
        }
    return {"config": task.config}


def _task_pods(plan: DagPlan) -> dict[str, dict[str, Any]]:
    """Per task, the KubernetesExecutor ``executor_config`` placing its pod (on Kubernetes).

    Empty unless ``TIDEFLOW_BACKEND=kubernetes``: locally, steps run where the
    worker is, and the kubernetes client is not imported while parsing.
    """
    from tideflow.config import Settings

    settings = Settings.from_env()
    if settings.backend != "kubernetes":
        return {}
    from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator

    from tideflow.inventory import load_cluster
    from tideflow.kube.pods import task_pod
    from tideflow.kube.settings import kube_settings_from_env

    kube = kube_settings_from_env()
    inventory = load_cluster(settings.cluster_file) if settings.cluster_file else None
    return {
        task.task_id: {
            "pod_override": PodGenerator.deserialize_model_dict(task_pod(task, kube, inventory))
        }
        for task in plan.tasks
    }


def build_dag(plan: DagPlan, source: Path | None = None) -> DAG:
    doc = f"**tideflow pipeline** `{plan.dag_id}` (team `{plan.team}`)"
    if source is not None:
        doc += f" from `{source}`"
    if plan.description:
        doc += f"\n\n{plan.description}"
    dag = DAG(
        dag_id=plan.dag_id,
        description=plan.description or None,
        schedule=plan.schedule,
        start_date=START_DATE,
        catchup=False,
        # None keeps Airflow's [core] dags_are_paused_at_creation; only a new DAG is affected.
        is_paused_upon_creation=plan.paused_at_creation,
        tags=list(plan.tags),
        params={name: Param(p.default, **p.param_kwargs()) for name, p in plan.params.items()},
        default_args={"owner": ", ".join(plan.owners) or plan.team},
        # Airflow's native rendering literal_evals every string (a string param "[1, 2]"
        # would arrive as a list); tideflow's operators render typed themselves
        # (tideflow.operators.templating): '{{ params.seed }}' still reaches them as 42.
        render_template_as_native_obj=False,
        doc_md=doc,
        on_success_callback=pipeline_run_succeeded,
        on_failure_callback=pipeline_run_failed,
    )
    tasks = {}
    pods = _task_pods(plan)
    for task in plan.tasks:
        operator_class = getattr(operators, task.operator)
        extra = {"executor_config": pods[task.task_id]} if task.task_id in pods else {}
        tasks[task.task_id] = operator_class(
            task_id=task.task_id,
            pipeline=plan.dag_id,
            team=plan.team,
            pool=task.pool,
            pool_slots=task.pool_slots,
            retries=task.retries,
            execution_timeout=(
                dt.timedelta(seconds=task.timeout_seconds) if task.timeout_seconds else None
            ),
            dag=dag,
            code_path=plan.code_path,
            **extra,
            **_operator_kwargs(task, plan),
        )
    for task in plan.tasks:
        for upstream in task.upstream:
            tasks[upstream] >> tasks[task.task_id]
    return dag
