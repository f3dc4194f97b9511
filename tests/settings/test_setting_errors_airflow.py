"""A setting Airflow's processes cannot use is one message naming it, never a traceback.

The DAG files (parsed by the DAG processor) file it as the DAG file's import error, the
message alone; an operator fails at task start with it (no retry: the same setting
fails the same way), and its internals' traceback is not chained to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

BAD_PARSE_SETTINGS = [
    ("TIDEFLOW_BACKEND", "nomad"),
    ("TIDEFLOW_HOME", "{tmp}/a-file/home"),
    ("TIDEFLOW_ARTIFACT_ROOT", " "),
    ("TIDEFLOW_PIPELINES_DIR", "\x01\x00"),
]
BAD_BROKER_SETTINGS = [
    ("TIDEFLOW_BROKER_SENSE_S", "abc"),
    ("TIDEFLOW_BROKER_POLL_S", "0"),
    ("TIDEFLOW_BROKER_POLL_S", "-inf"),
    ("TIDEFLOW_BROKER_LOAD", "x:y"),
    ("TIDEFLOW_BROKER_PER_GPU_RPS", "nan"),
    ("TIDEFLOW_BROKER_GRACE_S", "-1"),
    ("TIDEFLOW_BROKER_DEVICE_CLASS", "tpu"),
    ("TIDEFLOW_HOME", "{tmp}/a-file/home"),
]


def import_errors(repo: Path, dag_file: str) -> tuple[dict[str, str], list[str]]:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(repo / "dags" / dag_file))
    return dict(bag.import_errors), list(bag.dag_ids)


def _set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, value: str) -> str:
    (tmp_path / "a-file").write_text("")
    shown = value.format(tmp=tmp_path)
    monkeypatch.setenv(name, shown.replace("\x00", ""))  # the OS refuses a NUL
    return shown.replace("\x00", "")


def _one_message(errors: dict[str, str], name: str, value: str) -> None:
    assert len(errors) == 1, errors
    (text,) = errors.values()
    assert "Traceback" not in text and 'File "' not in text, text
    assert text.startswith(f"{name}={value!r}: "), text  # then what is accepted
    assert len(text.strip().splitlines()) == 1, text


@pytest.mark.parametrize(("name", "value"), BAD_PARSE_SETTINGS)
def test_the_pipelines_dag_file_shows_a_bad_setting_as_its_message(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    shown = _set(monkeypatch, tmp_path, name, value)
    errors, dag_ids = import_errors(repo, "tideflow_pipelines.py")
    _one_message(errors, name, shown)
    assert dag_ids == []


@pytest.mark.parametrize(("name", "value"), BAD_BROKER_SETTINGS)
def test_the_broker_dag_file_shows_a_bad_setting_as_its_message(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv("TIDEFLOW_BROKER_LOAD", "synthetic:100")
    monkeypatch.setenv("TIDEFLOW_BROKER_PER_GPU_RPS", "50")
    shown = _set(monkeypatch, tmp_path, name, value)
    errors, dag_ids = import_errors(repo, "tideflow_broker.py")
    _one_message(errors, name, shown)
    assert dag_ids == []


def test_the_broker_dag_file_still_builds_its_dag(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDEFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("TIDEFLOW_BROKER_LOAD", "synthetic:100")
    monkeypatch.setenv("TIDEFLOW_BROKER_PER_GPU_RPS", "50")
    monkeypatch.setenv("TIDEFLOW_BROKER_SENSE_S", "60")
    assert import_errors(repo, "tideflow_broker.py") == ({}, ["tideflow_broker"])


def _task_context(tmp_path: Path) -> dict[str, Any]:
    class TaskInstance:
        try_number = 1

    return {"ti": TaskInstance(), "params": {}, "run_id": "manual__1"}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TIDEFLOW_BACKEND", "nomad"),
        ("TIDEFLOW_HOME", "{tmp}/a-file/home"),
        ("TIDEFLOW_ARTIFACT_ROOT", ""),
        ("TIDEFLOW_K8S_GRACE_S", "abc"),
        ("TIDEFLOW_PROMOTION_CLAIM_TTL_S", "-5"),
    ],
)
def test_an_operator_fails_at_task_start_with_the_setting_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    from airflow.exceptions import AirflowFailException

    from tideflow.operators.data_prep import DataPrepOperator

    shown = _set(monkeypatch, tmp_path, name, value)
    operator = DataPrepOperator(
        task_id="prep", pipeline="digits", team="research", entrypoint="x:y", args={}
    )
    with pytest.raises(AirflowFailException) as failed:
        operator.pre_execute(_task_context(tmp_path))
    assert str(failed.value).startswith(f"{name}={shown!r}: ")
    assert "accepted: " in str(failed.value)
    assert failed.value.__cause__ is None and failed.value.__suppress_context__
