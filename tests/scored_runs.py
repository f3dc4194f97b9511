"""Pipelines whose gang commits scored checkpoints (tests/scored_gang.py), run by dag.test().

The gang commits steps 10, 20 and 30 scored ``SCORES`` (the run peaked at step
20; step 30 is the newest); the evaluation re-scores the checkpoint it is given
(its val_accuracy), so its metrics say which checkpoint it was.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
SCORES = (0.93, 0.951, 0.944)  # steps 10, 20, 30: the run peaked at step 20
KEEP_BEST = "keep_best: {metric: val_accuracy, mode: max}"


def scored_pipeline(
    tmp_path: Path, name: str, *, keep_best: str = KEEP_BEST, evaluation: str = "", tail: str = ""
) -> Path:
    """A gang that commits steps 10, 20, 30 scored SCORES, and an evaluation that re-scores
    the checkpoint it is given (its val_accuracy); ``tail``: more steps, as YAML lines of
    the ``steps`` list."""
    path = tmp_path / f"{name}.yaml"
    text = textwrap.dedent(f"""\
        apiVersion: tideflow/v1
        kind: Pipeline
        metadata: {{name: {name}, team: vision}}
        steps:
          - name: train
            gang_training:
              entrypoint: [python, {REPO / "tests" / "scored_gang.py"}]
              args: {{scores: "{",".join(map(str, SCORES))}"}}
              workers: 1
              checkpoint: {{{keep_best}}}
              max_restarts: 0
          - name: evaluate
            needs: [train]
            evaluation:
              entrypoint: tests.step_entrypoints:score_checkpoint
              devices: [cpu]
              metrics: [accuracy, loss]
        """)
    if evaluation:
        text += f"      {evaluation}\n"
    path.write_text(text + tail)
    return path


def run_pipeline(path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from tideflow.compile.dag_plan import compile_dag_plan
    from tideflow.dag.builder import build_dag
    from tideflow.spec import load_pipeline

    monkeypatch.setenv("TIDEFLOW_PIPELINES_DIR", str(path))
    dag = build_dag(compile_dag_plan(load_pipeline(path)))
    for task in dag.tasks:  # poll quickly in tests
        for attribute in ("lease_poll_s", "gang_poll_s", "poll_s"):
            if hasattr(task, attribute):
                setattr(task, attribute, 0.3)
    return dag.test()


def step_run(pipeline: str, step: str, dag_run_id: str) -> Any:
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    experiment = client.get_experiment_by_name(pipeline)
    (run,) = client.search_runs(
        [experiment.experiment_id],
        f"tags.`tideflow.step` = '{step}' and tags.`tideflow.dag_run_id` = '{dag_run_id}'",
    )
    return run


def xcom_of(dag_run: Any, task_id: str) -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(
            XComModel.get_many(
                run_id=dag_run.run_id, dag_ids=dag_run.dag_id, task_ids=task_id, key="return_value"
            )
        ).first()
        return None if row is None else XComModel.deserialize_value(row)
