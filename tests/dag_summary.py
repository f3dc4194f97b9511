"""A stable, JSON-able summary of an Airflow DAG for golden files."""

from __future__ import annotations

from typing import Any


def summarize(dag: Any) -> dict[str, Any]:
    params = {}
    for name in sorted(dag.params.keys()):
        param = dag.params.get_param(name)
        params[name] = {
            "default": param.value,
            "schema": param.schema,
            "description": param.description,
        }
    tasks = {}
    for task in sorted(dag.tasks, key=lambda t: t.task_id):
        timeout = task.execution_timeout.total_seconds() if task.execution_timeout else None
        tasks[task.task_id] = {
            "operator": f"{type(task).__module__}.{type(task).__name__}",
            "upstream": sorted(task.upstream_task_ids),
            "pool": task.pool,
            "pool_slots": task.pool_slots,
            "retries": task.retries,
            "execution_timeout_s": timeout,
            "owner": task.owner,
            "template_fields": list(task.template_fields),
        }
    return {
        "dag_id": dag.dag_id,
        "schedule": dag.schedule,
        "catchup": dag.catchup,
        "tags": sorted(dag.tags),
        "render_template_as_native_obj": dag.render_template_as_native_obj,
        "params": params,
        "tasks": tasks,
    }
