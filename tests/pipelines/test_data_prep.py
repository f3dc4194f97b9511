"""DataPrepOperator through Airflow's real ``dag.test()`` and a SQLite metadata DB."""

from __future__ import annotations

import io
import shutil
import textwrap
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pytest

pytestmark = pytest.mark.processes


def run_dag(  # type: ignore[no-untyped-def]
    pipeline: Path,
    monkeypatch: pytest.MonkeyPatch,
    conf: dict[str, Any] | None = None,
    only: str | None = None,
):
    """``dag.test()`` of the pipeline's DAG, or of its task ``only`` and what it needs."""
    from tideflow.compile.dag_plan import compile_dag_plan
    from tideflow.dag.builder import build_dag
    from tideflow.spec import load_pipeline

    monkeypatch.setenv("TIDEFLOW_PIPELINES_DIR", str(pipeline))
    dag = build_dag(compile_dag_plan(load_pipeline(pipeline)))
    if only is not None:
        dag = dag.partial_subset(only, include_upstream=True)
    return dag.test(run_conf=conf or {})


def xcom(dag_run: Any, task_id: str, key: str = "return_value") -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(
            XComModel.get_many(
                run_id=dag_run.run_id,
                dag_ids=dag_run.dag_id,
                task_ids=task_id,
                key=key,
            )
        ).first()
        return None if row is None else XComModel.deserialize_value(row)


def states(dag_run: Any) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}


def load_npz(uri: str) -> dict[str, np.ndarray]:
    path = Path(urlparse(uri).path)
    assert path.is_file(), f"{uri} was not written"
    with np.load(io.BytesIO(path.read_bytes())) as data:
        return {key: data[key] for key in data.files}


def write_pipeline(tmp_path: Path, step_yaml: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(
        textwrap.dedent("""\
        apiVersion: tideflow/v1
        kind: Pipeline
        metadata: {name: prep-test, team: qa}
        steps:
        """)
        + textwrap.indent(textwrap.dedent(step_yaml), "  ")
    )
    return path


@pytest.mark.usefixtures("airflow_home")
def test_digits_split_is_written_to_the_store_with_expected_rows(
    repo: Path, artifact_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dag_run = run_dag(
        repo / "pipelines" / "digits.yaml",
        monkeypatch,
        {"validation_fraction": 0.25, "seed": 3},
        only="prepare-data",  # training on the split is the other tests' concern
    )
    assert str(dag_run.state) == "success", states(dag_run)
    assert set(states(dag_run)) == {"prepare-data"}
    outputs = xcom(dag_run, "prepare-data")
    assert sorted(outputs) == ["train", "validation"]
    train, validation = load_npz(outputs["train"]), load_npz(outputs["validation"])
    # 1,797 samples; sklearn rounds the held-out share up: ceil(0.25 * 1797) = 450
    assert train["x"].shape == (1347, 64) and train["y"].shape == (1347,)
    assert validation["x"].shape == (450, 64) and validation["y"].shape == (450,)
    assert sorted(set(validation["y"].tolist())) == list(range(10))  # stratified
    assert Path(urlparse(outputs["train"]).path).is_relative_to(artifact_root)


@pytest.mark.usefixtures("airflow_home")
def test_failing_entrypoint_fails_the_task_with_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    pipeline = write_pipeline(
        tmp_path,
        """\
        - name: explode
          data_prep:
            entrypoint: tests.step_entrypoints:boom
            args: {reason: "disk full on purpose"}
        """,
    )
    dag_run = run_dag(pipeline, monkeypatch)
    assert str(dag_run.state) == "failed"
    assert states(dag_run) == {"explode": "failed"}
    log = capfd.readouterr().out
    assert "about to fail in step explode" in log  # child output streamed to the task log
    assert "entry point tests.step_entrypoints:boom exited with code 1" in log
    assert "ValueError: disk full on purpose" in log


@pytest.mark.usefixtures("airflow_home")
def test_missing_declared_output_fails_the_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    pipeline = write_pipeline(
        tmp_path,
        """\
        - name: partial
          data_prep:
            entrypoint: tests.step_entrypoints:forgets_an_output
            outputs: [train, validation]
        """,
    )
    dag_run = run_dag(pipeline, monkeypatch)
    assert str(dag_run.state) == "failed"
    assert "did not return declared output(s) ['validation']" in capfd.readouterr().out


@pytest.mark.usefixtures("airflow_home")
def test_command_entrypoint_passes_outputs_downstream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = shutil.which("python3") or "python3"
    script = tmp_path / "make_output.py"
    script.write_text(
        textwrap.dedent("""\
        import json, os, sys
        ctx = json.load(open(os.environ["TIDEFLOW_STEP_CONTEXT"]))
        out = sys.argv[1]
        open(out, "w").write(ctx["run_id"])
        json.dump({"marker": out}, open(os.environ["TIDEFLOW_STEP_OUTPUTS"], "w"))
        """)
    )
    pipeline = write_pipeline(
        tmp_path,
        f"""\
        - name: produce
          data_prep:
            entrypoint: [{python}, {script}, "{tmp_path}/{{{{ params.name }}}}.txt"]
            outputs: [marker]
        - name: consume
          needs: [produce]
          data_prep:
            entrypoint: [{python}, -c, "import sys; assert open(sys.argv[1]).read(), 'empty'",
                         "{{{{ ti.xcom_pull(task_ids='produce')['marker'] }}}}"]
        """,
    )
    text = pipeline.read_text().replace(
        "steps:", "params:\n  name: {type: string, default: m}\nsteps:"
    )
    pipeline.write_text(text)
    dag_run = run_dag(pipeline, monkeypatch, {"name": "hello"})
    assert str(dag_run.state) == "success", states(dag_run)
    assert xcom(dag_run, "produce") == {"marker": f"{tmp_path}/hello.txt"}
    assert (tmp_path / "hello.txt").read_text() == dag_run.run_id


@pytest.mark.usefixtures("airflow_home")
def test_task_has_an_extra_link_to_its_mlflow_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tracking goes to the test's SQLite store; the UI address is the override
    # people use when MLflow is browsed under another name than the workers use.
    monkeypatch.setenv("TIDEFLOW_MLFLOW_UI_URL", "http://mlflow.example:5000/")
    pipeline = write_pipeline(
        tmp_path,
        """\
        - name: produce
          data_prep:
            entrypoint: tests.step_entrypoints:emit_marker
            outputs: [marker]
        """,
    )
    dag_run = run_dag(pipeline, monkeypatch)
    assert str(dag_run.state) == "success", states(dag_run)
    run_id = xcom(dag_run, "produce", "mlflow_run_id")
    link = xcom(dag_run, "produce", "_link_MlflowRunLink")
    assert run_id and link.startswith("http://mlflow.example:5000/#/experiments/")
    assert link.endswith(f"/runs/{run_id}")

    # The DAG's success callback closed the run's parent MLflow run.
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    parent_id = client.get_run(run_id).data.tags["mlflow.parentRunId"]
    assert client.get_run(parent_id).info.status == "FINISHED"
