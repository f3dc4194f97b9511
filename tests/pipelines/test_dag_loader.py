"""The DAG loader through Airflow's real DagBag (no scheduler, no database)."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import airflow_home_from
from tests.dag_summary import summarize

GOLDEN = Path(__file__).parents[1] / "golden"
UPDATE = os.environ.get("TIDEFLOW_UPDATE_GOLDEN") == "1"


def dagbag(repo: Path):  # type: ignore[no-untyped-def]
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(repo / "dags" / "tideflow_pipelines.py"))


def test_pipelines_dir_loads_without_import_errors(repo: Path) -> None:
    bag = dagbag(repo)
    assert bag.import_errors == {}
    assert sorted(bag.dag_ids) == ["digits"]


def test_broken_pipeline_does_not_hide_the_others(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copy(repo / "pipelines" / "digits.yaml", tmp_path / "digits.yaml")
    shutil.copy(Path(__file__).parents[1] / "data" / "pipelines" / "full.yaml", tmp_path)
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        "apiVersion: tideflow/v1\nkind: Pipeline\nmetadata: {name: broken, team: x}\n"
        "steps:\n  - name: a\n    data_prep: {entrypoint: 'm:f', workerz: 2}\n"
    )
    monkeypatch.setenv("TIDEFLOW_PIPELINES_DIR", str(tmp_path))
    bag = dagbag(repo)
    assert sorted(bag.dag_ids) == ["digits", "full"]
    assert list(bag.import_errors) == [str(broken)]
    message = bag.import_errors[str(broken)]
    assert f"{broken}:6:36: steps[0].data_prep.workerz: unknown field 'workerz'" in message


BROKEN = (
    "apiVersion: tideflow/v1\nkind: Pipeline\nmetadata: {name: broken, team: x}\n"
    "steps:\n  - name: a\n    data_prep: {entrypoint: 'm:f', workerz: 2}\n"
)
# What Airflow's task process does first (task_runner.startup): parse the DAG file of
# its task, inside the parsing context that names the DAG and task.
TASK_STARTUP = """\
import datetime as dt, sys, uuid
from airflow.sdk.api.datamodels._generated import (
    BundleInfo, DagRun, TaskInstance, TIRunContext)
from airflow.sdk.execution_time.comms import StartupDetails
from airflow.sdk.execution_time.task_runner import startup

dag_id, task_id = sys.argv[1:3]
now = dt.datetime.now(dt.UTC)
run = DagRun(dag_id=dag_id, run_id="r", logical_date=None, data_interval_start=None,
             data_interval_end=None, run_after=now, start_date=now, end_date=None,
             run_type="manual", state="running", consumed_asset_events=[], partition_key=None)
ti, _, _ = startup(StartupDetails(
    ti=TaskInstance(id=uuid.uuid4(), task_id=task_id, dag_id=dag_id, run_id="r",
                    try_number=1, dag_version_id=uuid.uuid4()),
    dag_rel_path="tideflow_pipelines.py", bundle_info=BundleInfo(name="dags-folder"),
    start_date=now, ti_context=TIRunContext(dag_run=run, max_tries=0), sentry_integration=""))
print("PARSED", ti.task.dag.dag_id, ti.task.task_id, flush=True)
"""


@pytest.mark.processes
def test_a_task_shows_no_other_pipelines_errors(repo: Path, tmp_path: Path) -> None:
    """A task of digits parses the one DAG file, and is not told that broken.yaml is broken."""
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    shutil.copy(repo / "pipelines" / "digits.yaml", pipelines)
    (pipelines / "broken.yaml").write_text(BROKEN)
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(repo / "dags"),
        "TIDEFLOW_PIPELINES_DIR": str(pipelines),
    }
    done = subprocess.run(
        [sys.executable, "-c", TASK_STARTUP, "digits", "prepare-data"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "PARSED digits prepare-data" in done.stdout
    task_log = done.stdout + done.stderr
    assert "Worker startup parse complete" in task_log  # the task's own log lines are here
    assert "broken" not in task_log and "workerz" not in task_log


def test_a_parse_for_one_dag_builds_it_and_reports_only_its_own_errors(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a real DagBag, as the DAG processor parses and as a task parses."""
    from airflow.sdk.definitions.context import (
        _AIRFLOW_PARSING_CONTEXT_DAG_ID,
        _AIRFLOW_PARSING_CONTEXT_TASK_ID,
    )

    def parse_for(dag_id: str, task_id: str):  # type: ignore[no-untyped-def]
        """As the task runner parses (its context manager leaves the variables set)."""
        with monkeypatch.context() as context:
            context.setenv(_AIRFLOW_PARSING_CONTEXT_DAG_ID, dag_id)
            context.setenv(_AIRFLOW_PARSING_CONTEXT_TASK_ID, task_id)
            return dagbag(repo)

    shutil.copy(repo / "pipelines" / "digits.yaml", tmp_path)
    shutil.copy(Path(__file__).parents[1] / "data" / "pipelines" / "full.yaml", tmp_path)
    broken = tmp_path / "broken.yaml"
    broken.write_text(BROKEN)
    unreadable = tmp_path / "unreadable.yaml"
    unreadable.write_text("metadata: {name: [\n")
    monkeypatch.setenv("TIDEFLOW_PIPELINES_DIR", str(tmp_path))
    # the DAG processor: every pipeline, every broken file
    bag = dagbag(repo)
    assert sorted(bag.dag_ids) == ["digits", "full"]
    assert sorted(bag.import_errors) == [str(broken), str(unreadable)]
    # a task of digits: its DAG only, and no other file's problems
    bag = parse_for("digits", "train")
    assert bag.dag_ids == ["digits"]
    assert bag.import_errors == {}
    # a task of the broken pipeline: its own problems, and those of a file whose name
    # cannot be read (it may be the one), since its DAG cannot be built
    bag = parse_for("broken", "a")
    assert bag.dag_ids == []
    assert sorted(bag.import_errors) == [str(broken), str(unreadable)]
    assert "steps[0].data_prep.workerz: unknown field 'workerz'" in bag.import_errors[str(broken)]


def test_duplicate_pipeline_names_are_an_import_error(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copy(repo / "pipelines" / "digits.yaml", tmp_path / "a.yaml")
    shutil.copy(repo / "pipelines" / "digits.yaml", tmp_path / "b.yaml")
    monkeypatch.setenv("TIDEFLOW_PIPELINES_DIR", str(tmp_path))
    bag = dagbag(repo)
    assert bag.dag_ids == ["digits"]
    assert (
        "pipeline name 'digits' is already used by" in bag.import_errors[str(tmp_path / "b.yaml")]
    )


@pytest.mark.processes
def test_parsing_imports_no_heavy_libraries_and_no_network(repo: Path) -> None:
    probe = (
        "import socket, sys\n"
        "def refuse(*a, **k): raise AssertionError('network touched during parsing')\n"
        "socket.socket.connect = refuse\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(repo / 'dags' / 'tideflow_pipelines.py')!r})\n"
        "assert not bag.import_errors, bag.import_errors\n"
        "heavy = [m for m in ('torch', 'mlflow', 'boto3', 'botocore', 'sklearn', 'hera')"
        " if m in sys.modules]\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "HEAVY=\n" in done.stdout


def test_dag_file_is_the_shipped_loader(repo: Path) -> None:
    from tideflow.dag.loader import LOADER_SOURCE

    assert (repo / "dags" / "tideflow_pipelines.py").read_text() == LOADER_SOURCE


@pytest.mark.parametrize("pipeline", ["pipelines/digits.yaml", "tests/data/pipelines/full.yaml"])
def test_compiled_dag_matches_golden(repo: Path, pipeline: str) -> None:
    from tideflow.compile.dag_plan import compile_dag_plan
    from tideflow.dag.builder import build_dag
    from tideflow.spec import load_pipeline

    dag = build_dag(compile_dag_plan(load_pipeline(repo / pipeline)))
    summary = json.dumps(summarize(dag), indent=2, sort_keys=True) + "\n"
    golden = GOLDEN / f"{Path(pipeline).stem}.dag.json"
    if UPDATE:
        golden.write_text(summary)
    assert golden.exists(), f"missing {golden}; run with TIDEFLOW_UPDATE_GOLDEN=1 once"
    assert summary == golden.read_text(), (
        f"compiled DAG differs from {golden}; if the change is intended, regenerate with "
        "TIDEFLOW_UPDATE_GOLDEN=1 and review the diff"
    )


UNKNOWN_NEEDS = (
    "apiVersion: tideflow/v1\nkind: Pipeline\nmetadata: {name: broken, team: x}\n"
    "steps:\n  - name: a\n    needs: [nope]\n    data_prep: {entrypoint: 'm:f'}\n"
)


class ProcessedHome:
    """An Airflow home whose metadata DB one real ``airflow dag-processor`` run filled
    from a pipelines folder: digits as shipped (``paused_at_creation`` unset), ``active``
    and ``held`` (set to false and true) and ``broken.yaml`` (an unknown ``needs``)."""

    def __init__(self, repo: Path, root: Path, migrated_db: Path) -> None:
        self.pipelines = root / "pipelines"
        self.pipelines.mkdir()
        digits = (repo / "pipelines" / "digits.yaml").read_text()
        shutil.copy(repo / "pipelines" / "digits.yaml", self.pipelines)
        for name, paused in (("active", "false"), ("held", "true")):
            (self.pipelines / f"{name}.yaml").write_text(
                digits.replace(
                    "  name: digits\n", f"  name: {name}\n  paused_at_creation: {paused}\n"
                )
            )
        self.broken = self.pipelines / "broken.yaml"
        self.broken.write_text(UNKNOWN_NEEDS)
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(root / "airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(repo / "dags"),
            "TIDEFLOW_PIPELINES_DIR": str(self.pipelines),
        }
        airflow_home_from(migrated_db, root / "airflow")  # as `airflow db migrate` leaves it
        self.airflow("dag-processor", "--num-runs", "1")

    def run(self, *args: str, ok: tuple[int, ...] = (0,)) -> str:
        done = subprocess.run(
            args, env=self.env, capture_output=True, text=True, timeout=180, check=False
        )
        assert done.returncode in ok, done.stderr[-3000:]
        return done.stdout

    def airflow(self, *args: str, ok: tuple[int, ...] = (0,)) -> str:
        return self.run(str(Path(sys.executable).with_name("airflow")), *args, ok=ok)

    @functools.cached_property
    def listed(self) -> list[dict[str, str]]:
        """``airflow dags list``: what the processed home holds (asked once)."""
        return self.airflow_json("dags", "list")

    def airflow_json(self, *args: str, ok: tuple[int, ...] = (0,)) -> list[dict[str, str]]:
        text = self.airflow(*args, "-o", "json", ok=ok)
        # Airflow's CLI prints its Python warnings on stdout before the JSON
        return list(json.loads(text[text.index("\n[") + 1 :] if not text.startswith("[") else text))


@pytest.fixture(scope="module")
def processed(
    repo: Path, tmp_path_factory: pytest.TempPathFactory, migrated_airflow_db: Path
) -> ProcessedHome:
    return ProcessedHome(repo, tmp_path_factory.mktemp("dag-processor"), migrated_airflow_db)


@pytest.mark.processes
def test_paused_at_creation_is_how_airflow_creates_the_dag(
    repo: Path, processed: ProcessedHome
) -> None:
    """A real `airflow dag-processor` run creates each DAG paused or not, as its file says."""
    probe = (
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(repo / 'dags' / 'tideflow_pipelines.py')!r})\n"
        "print({d: bag.dags[d].is_paused_upon_creation for d in sorted(bag.dag_ids)})\n"
    )
    assert "{'active': False, 'digits': None, 'held': True}" in processed.run(
        sys.executable, "-c", probe
    )
    dags = processed.listed
    # Airflow's [core] dags_are_paused_at_creation is true unless a deployment changes it
    assert {d["dag_id"]: str(d["is_paused"]) for d in dags} == {
        "active": "False",
        "digits": "True",
        "held": "True",
    }


@pytest.mark.processes
def test_dag_processor_records_the_yaml_file_in_list_import_errors(
    processed: ProcessedHome,
) -> None:
    """Real `airflow dag-processor` run; the error is read back with the Airflow CLI."""
    # the command exits 1 when there are import errors
    errors = processed.airflow_json("dags", "list-import-errors", ok=(1,))
    assert [e["filepath"] for e in errors] == [str(processed.broken)]
    assert f"{processed.broken}:6:13: steps[0].needs[0]: unknown step 'nope'" in errors[0]["error"]
    # the broken file hides none of the others
    assert sorted(d["dag_id"] for d in processed.listed) == [
        "active",
        "digits",
        "held",
    ]
