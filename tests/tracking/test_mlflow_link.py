"""The "MLflow run" extra link of a tideflow task, as Airflow stores it when the task ends.

Airflow's worker asks every extra link for its address as a task finishes and
stores the answer. A step whose tracking store has no web page (SQLite, as
``tideflow run`` uses) pushes no address; asking for it then must not log an
error ("XCom not found") on every successful run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.pipelines.test_data_prep import run_dag, states, write_pipeline, xcom
from tideflow.operators.links import MLFLOW_RUN_URL_KEY, MlflowRunLink

pytestmark = pytest.mark.processes

STEP = """\
- name: mark
  data_prep: {entrypoint: "tests.step_entrypoints:emit_marker", outputs: [marker]}
"""


def stored_link(dag_run: object) -> object:
    return xcom(dag_run, "mark", MlflowRunLink().xcom_key)


@pytest.mark.usefixtures("airflow_home")
def test_no_mlflow_page_means_an_empty_link_and_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TIDEFLOW_MLFLOW_UI_URL", raising=False)  # SQLite: no page
    dag_run = run_dag(write_pipeline(tmp_path, STEP), monkeypatch)
    assert states(dag_run) == {"mark": "success"}
    assert xcom(dag_run, "mark", MLFLOW_RUN_URL_KEY) is None
    assert stored_link(dag_run) == ""
    out, err = capfd.readouterr()
    assert "XCom not found" not in out + err


@pytest.mark.usefixtures("airflow_home")
def test_the_link_is_the_steps_mlflow_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEFLOW_MLFLOW_UI_URL", "http://mlflow.example")
    dag_run = run_dag(write_pipeline(tmp_path, STEP), monkeypatch)
    assert states(dag_run) == {"mark": "success"}
    url = xcom(dag_run, "mark", MLFLOW_RUN_URL_KEY)
    assert url.startswith("http://mlflow.example/#/experiments/")
    assert stored_link(dag_run) == url
