"""Create (or find again) the MLflow runs of a pipeline run and its steps.

Runs are looked up by tags before they are created, so a retried task, a
second step of the same DAG run, or a re-run of the same step finds the runs
that exist instead of making duplicates. mlflow is imported only here, inside
functions: DAG parsing never pays for it.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tideflow import settings_registry as registry

log = logging.getLogger(__name__)

TAG_KIND = "tideflow.kind"
TAG_DAG_ID = "tideflow.dag_id"
TAG_RUN_ID = "tideflow.dag_run_id"
TAG_STEP = "tideflow.step"


@dataclass(frozen=True)
class RunIds:
    experiment_id: str
    pipeline_run_id: str
    step_run_id: str


def filter_literal(value: str) -> str:
    """``value`` as a string literal of an MLflow search filter.

    MLflow strips the quotes around a value and unescapes nothing, so the
    value goes inside the quote it does not contain. A value holding both
    quotes, or ending in a backslash (the tokenizer reads it as escaping the
    closing quote), cannot be written in a filter: ValueError.
    """
    if value.endswith("\\"):
        raise ValueError(f"{value!r} ends in a backslash: no MLflow search filter can hold it")
    for quote in ("'", '"'):
        if quote not in value:
            return f"{quote}{value}{quote}"
    raise ValueError(f"{value!r} holds both quotes: no MLflow search filter can hold it")


def _tags_filter(tags: dict[str, str]) -> str:
    return " and ".join(f"tags.`{k}` = {filter_literal(v)}" for k, v in tags.items())


def tracking_enabled() -> bool:
    return bool(os.environ.get("MLFLOW_TRACKING_URI"))


def git_commit(path: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=path.parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _client() -> Any:
    # Fail fast when the server is down: the operator logs and goes on untracked.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    from mlflow.tracking import MlflowClient

    return MlflowClient()


def _local_artifacts(pipeline: str) -> str | None:
    """Without a tracking server (sqlite:// or a path), keep artifacts under TIDEFLOW_HOME."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if uri.startswith(("http://", "https://", "databricks")):
        return None  # the server decides (e.g. proxied S3)
    home = Path(registry.optional_path("TIDEFLOW_HOME") or Path.cwd() / ".tideflow").resolve()
    return (home / "mlflow-artifacts" / pipeline).as_uri()


def _find(client: Any, experiment_id: str, tags: dict[str, str]) -> str | None:
    query = _tags_filter(tags)
    runs = client.search_runs(
        [experiment_id], filter_string=query, max_results=1, order_by=["attributes.start_time ASC"]
    )
    return str(runs[0].info.run_id) if runs else None


def _oldest(client: Any, experiment_id: str, tags: dict[str, str]) -> str | None:
    """Of the active runs with ``tags``, the one every writer agrees on: oldest, then lowest id."""
    query = _tags_filter(tags)
    runs = client.search_runs([experiment_id], filter_string=query, max_results=50)
    if not runs:
        return None
    first = min(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id))
    return str(first.info.run_id)


def _create_once(
    client: Any, experiment_id: str, find: dict[str, str], tags: dict[str, str]
) -> str:
    """Create a run that must exist once, even when several tasks create it at the same time.

    MLflow has no unique key on tags, so two tasks of one DAG run starting
    together would both find nothing and both create. Each creator looks
    again after creating; all of them settle on the same run (the oldest),
    and a creator whose run lost deletes it before anything hangs below it.
    """
    mine = str(client.create_run(experiment_id, tags={**find, **tags}).info.run_id)
    winner = _oldest(client, experiment_id, find) or mine
    if winner != mine:
        client.delete_run(mine)
    return winner


def _experiment(client: Any, pipeline: str, team: str) -> str:
    experiment = client.get_experiment_by_name(pipeline)
    if experiment is not None:
        return str(experiment.experiment_id)
    from mlflow.exceptions import MlflowException

    try:
        return str(
            client.create_experiment(
                pipeline,
                artifact_location=_local_artifacts(pipeline),
                tags={"tideflow.team": team},
            )
        )
    except MlflowException:  # created meanwhile by another task of the pipeline
        experiment = client.get_experiment_by_name(pipeline)
        if experiment is None:
            raise
        return str(experiment.experiment_id)


def ensure_runs(
    *,
    pipeline: str,
    team: str,
    dag_id: str,
    dag_run_id: str,
    step: str,
    kind: str,
    pipeline_file: str | None = None,
    params: dict[str, Any] | None = None,
) -> RunIds:
    client = _client()
    experiment_id = _experiment(client, pipeline, team)
    parent_tags = {TAG_KIND: "pipeline-run", TAG_DAG_ID: dag_id, TAG_RUN_ID: dag_run_id}
    parent = _find(client, experiment_id, parent_tags)
    if parent is None:
        tags = {"tideflow.team": team, "mlflow.runName": dag_run_id}
        if pipeline_file:
            tags["tideflow.pipeline_file"] = pipeline_file
            commit = git_commit(Path(pipeline_file))
            if commit:
                tags["mlflow.source.git.commit"] = commit
        parent = _create_once(client, experiment_id, parent_tags, tags)
        for name, value in (params or {}).items():
            client.log_param(parent, name, value)
    step_tags = {TAG_KIND: "step", TAG_RUN_ID: dag_run_id, TAG_STEP: step}
    child = _find(client, experiment_id, step_tags)
    if child is None:
        tags = {
            TAG_DAG_ID: dag_id,
            "tideflow.step_kind": kind,
            "tideflow.team": team,
            "mlflow.parentRunId": parent,
            "mlflow.runName": step,
        }
        child = str(client.create_run(experiment_id, tags={**step_tags, **tags}).info.run_id)
    return RunIds(experiment_id, parent, child)


def ensure_workflow_runs(
    *,
    pipeline: str,
    team: str,
    run_id: str,
    step: str,
    kind: str,
    params: dict[str, Any] | None = None,
) -> RunIds:
    """``ensure_runs`` for a step that no Airflow DAG runs (an Argo workflow's): the
    pipeline stands for the DAG id and the workflow run's name for the DAG run id."""
    return ensure_runs(
        pipeline=pipeline,
        team=team,
        dag_id=pipeline,
        dag_run_id=run_id,
        step=step,
        kind=kind,
        params=params,
    )


def finish_step_run(
    run_id: str,
    *,
    succeeded: bool,
    tags: dict[str, str] | None = None,
    metrics: dict[str, float] | None = None,
) -> None:
    client = _client()
    for key, value in (tags or {}).items():
        client.set_tag(run_id, key, value)
    for name, number in (metrics or {}).items():
        client.log_metric(run_id, name, number)
    client.set_terminated(run_id, "FINISHED" if succeeded else "FAILED")


def finish_step_run_or_warn(
    run_id: str | None,
    warn: Callable[[str], object],
    *,
    succeeded: bool,
    tags: dict[str, str] | None = None,
    metrics: dict[str, float] | None = None,
) -> None:
    """``finish_step_run``, where MLflow being down must not fail the step that ran."""
    if run_id is None:
        return
    try:
        finish_step_run(run_id, succeeded=succeeded, tags=tags, metrics=metrics)
    except Exception as exc:
        warn(f"tideflow: could not record the step on MLflow: {exc}")


def finish_pipeline_run(*, pipeline: str, dag_id: str, dag_run_id: str, succeeded: bool) -> bool:
    """Close the parent run of a DAG run; False when it has none (never tracked).

    Runs once per DAG run (its success or failure callback), so it is where
    parents created twice by tasks that started together are merged: the
    oldest stays, every step run points at it, the others are deleted.
    """
    client = _client()
    experiment = client.get_experiment_by_name(pipeline)
    if experiment is None:
        return False
    experiment_id = experiment.experiment_id
    tags = {TAG_KIND: "pipeline-run", TAG_DAG_ID: dag_id, TAG_RUN_ID: dag_run_id}
    run_id = _oldest(client, experiment_id, tags)
    if run_id is None:
        return False
    _merge_parents(client, experiment_id, tags, run_id, dag_run_id)
    client.set_terminated(run_id, "FINISHED" if succeeded else "FAILED")
    return True


def _merge_parents(
    client: Any, experiment_id: str, tags: dict[str, str], keep: str, dag_run_id: str
) -> None:
    query = _tags_filter(tags)
    for run in client.search_runs([experiment_id], filter_string=query, max_results=50):
        if run.info.run_id != keep:
            client.delete_run(run.info.run_id)
    steps = _tags_filter({TAG_KIND: "step", TAG_RUN_ID: dag_run_id})
    for run in client.search_runs([experiment_id], filter_string=steps, max_results=1000):
        if run.data.tags.get("mlflow.parentRunId") != keep:
            client.set_tag(run.info.run_id, "mlflow.parentRunId", keep)
