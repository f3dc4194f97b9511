"""MLflow bookkeeping against a real MLflow store (SQLite): one parent run per DAG run,
even when the DAG run's first tasks start at the same moment."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from tideflow.tracking.runs import (
    TAG_DAG_ID,
    TAG_KIND,
    TAG_RUN_ID,
    _client,
    ensure_runs,
    finish_pipeline_run,
)


def runs_of(pipeline: str, dag_run_id: str, kind: str) -> list:
    client = _client()
    experiment = client.get_experiment_by_name(pipeline)
    query = f"tags.`{TAG_KIND}` = '{kind}' and tags.`{TAG_RUN_ID}` = '{dag_run_id}'"
    return list(client.search_runs([experiment.experiment_id], filter_string=query))


def test_tasks_starting_together_end_with_one_parent_run() -> None:
    pipeline, dag_run_id = f"race-{uuid.uuid4().hex[:8]}", "manual__1"
    ensure_runs(
        pipeline=pipeline, team="t", dag_id=pipeline, dag_run_id="warm", step="s", kind="data_prep"
    )  # the experiment exists; the race is on the parent run
    barrier = threading.Barrier(4)
    found = []

    def task(step: str) -> None:
        barrier.wait()
        found.append(
            ensure_runs(
                pipeline=pipeline,
                team="t",
                dag_id=pipeline,
                dag_run_id=dag_run_id,
                step=step,
                kind="data_prep",
            )
        )

    threads = [threading.Thread(target=task, args=(f"step-{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(found) == 4
    assert finish_pipeline_run(
        pipeline=pipeline, dag_id=pipeline, dag_run_id=dag_run_id, succeeded=True
    )
    (parent,) = runs_of(pipeline, dag_run_id, "pipeline-run")
    assert parent.info.status == "FINISHED"
    steps = runs_of(pipeline, dag_run_id, "step")
    assert sorted(r.data.tags["mlflow.runName"] for r in steps) == [f"step-{i}" for i in range(4)]
    assert {r.data.tags["mlflow.parentRunId"] for r in steps} == {parent.info.run_id}


def test_closing_a_dag_run_merges_parents_created_twice() -> None:
    """The race's worst case, made on purpose: two parents, a step under each."""
    client = _client()
    pipeline, dag_run_id = f"merge-{uuid.uuid4().hex[:8]}", "manual__2"
    experiment_id = client.create_experiment(pipeline)
    tags = {TAG_KIND: "pipeline-run", TAG_DAG_ID: pipeline, TAG_RUN_ID: dag_run_id}
    first = client.create_run(experiment_id, tags=tags, start_time=1000).info.run_id
    second = client.create_run(experiment_id, tags=tags, start_time=2000).info.run_id
    for parent, step in ((first, "a"), (second, "b")):
        client.create_run(
            experiment_id,
            tags={
                TAG_KIND: "step",
                TAG_RUN_ID: dag_run_id,
                "mlflow.parentRunId": parent,
                "mlflow.runName": step,
            },
        )
    assert finish_pipeline_run(
        pipeline=pipeline, dag_id=pipeline, dag_run_id=dag_run_id, succeeded=False
    )
    (parent,) = runs_of(pipeline, dag_run_id, "pipeline-run")
    assert parent.info.run_id == first and parent.info.status == "FAILED"  # the oldest stays
    assert client.get_run(second).info.lifecycle_stage == "deleted"
    steps = runs_of(pipeline, dag_run_id, "step")
    assert {r.data.tags["mlflow.parentRunId"] for r in steps} == {first}
    assert (
        ensure_runs(
            pipeline=pipeline,
            team="t",
            dag_id=pipeline,
            dag_run_id=dag_run_id,
            step="a",
            kind="data_prep",
        ).pipeline_run_id
        == first
    )


@pytest.mark.processes
def test_the_operator_delivers_a_gangs_spooled_metrics_without_importing_torch(
    repo: Path,
) -> None:
    """The operator closing a gang step runs in an Airflow task: importing torch there, to
    deliver metrics, cost each gang step seconds. Imported the way the operator does."""
    source = (repo / "operators" / "gang_results.py").read_text()
    found = re.search(r"from (\S+) import flush_spool", source)
    assert found, "operators/gang_results.py no longer imports flush_spool"
    code = f"import sys; from {found.group(1)} import flush_spool; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert done.stdout.strip() == "False"
