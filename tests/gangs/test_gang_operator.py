"""GangTrainingOperator through Airflow's real ``dag.test()``, deferral and triggers included.

The workers are tiny Python processes (tests/gang_worker.py) on the CPU of this
machine; the lease ledger and the local backend are the real ones.
"""

from __future__ import annotations

import datetime as dt
import re
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tideflow.backends.local import LocalBackend
from tideflow.config import Settings
from tideflow.gangs import gang_id_for
from tideflow.inventory import detect_local
from tideflow.scheduling import GangRequest, Lease, LeaseLedger

pytestmark = pytest.mark.processes

WORKER = str(Path(__file__).parents[1] / "gang_worker.py")


def pipeline(
    tmp_path: Path,
    *,
    workers: int = 2,
    mode: str = "ok",
    name: str = "gang-test",
    timeout: str = "null",
) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        apiVersion: tideflow/v1
        kind: Pipeline
        metadata: {{name: {name}, team: qa}}
        steps:
          - name: train
            timeout: {timeout}
            gang_training:
              entrypoint: [python, {WORKER}]
              env: {{GANG_TEST_MODE: {mode}}}
              workers: {workers}
              device: {{class: cpu}}
              max_restarts: 1
        """)
    )
    return path


def run_dag(
    path: Path, monkeypatch: pytest.MonkeyPatch, logical_date: dt.datetime | None = None
) -> Any:
    from tideflow.compile.dag_plan import compile_dag_plan
    from tideflow.dag.builder import build_dag
    from tideflow.spec import load_pipeline

    monkeypatch.setenv("TIDEFLOW_PIPELINES_DIR", str(path))
    dag = build_dag(compile_dag_plan(load_pipeline(path)))
    for task in dag.tasks:  # poll quickly in tests
        task.lease_poll_s = 0.5
        task.gang_poll_s = 0.3
    if logical_date is None:
        return dag.test()
    return dag.test(logical_date=logical_date, run_after=logical_date)


def ledger() -> LeaseLedger:
    return LeaseLedger(Settings.from_env().home / "leases.db", detect_local())


def states(dag_run: Any) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}


@pytest.mark.usefixtures("airflow_home")
def test_gang_step_runs_all_workers_and_releases_its_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dag_run = run_dag(pipeline(tmp_path), monkeypatch)
    assert states(dag_run) == {"train": "success"}
    assert ledger().leases() == []
    gang = gang_id_for("gang-test", dag_run.run_id, "train")
    log = LocalBackend(Settings.from_env().home / "gangs").log_path(gang).read_text()
    assert log.count('"WORLD_SIZE": "2"') == 2


@pytest.mark.usefixtures("airflow_home")
def test_gang_that_can_never_fit_fails_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    cores = detect_local().total("cpu")
    dag_run = run_dag(pipeline(tmp_path, workers=cores + 1, name="too-big"), monkeypatch)
    assert states(dag_run) == {"train": "failed"}
    assert "gang can never be placed" in capfd.readouterr().out


@pytest.mark.usefixtures("airflow_home")
def test_gang_waits_without_holding_devices_then_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cores = detect_local().total("cpu")
    book = ledger()
    blocker = book.try_acquire(
        GangRequest("someone-else", "other", "cpu", None, cores, 1), "test", 600
    )
    assert isinstance(blocker, Lease)
    seen_waiting: list[list[str]] = []

    def free_later() -> None:
        time.sleep(4)
        seen_waiting.append([r.gang_id for r, _ in book.waiting()])
        book.release(blocker.lease_id)

    thread = threading.Thread(target=free_later)
    thread.start()
    dag_run = run_dag(pipeline(tmp_path, name="waiter"), monkeypatch)
    thread.join()
    assert states(dag_run) == {"train": "success"}
    # while blocked, the gang was queued and held nothing
    assert seen_waiting == [[gang_id_for("waiter", dag_run.run_id, "train")]]


@pytest.mark.usefixtures("airflow_home")
def test_a_retry_reattaches_instead_of_starting_a_second_gang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An earlier try submitted the gang and died; the next try must find it running."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.types import DagRunType

    from tideflow.backends import GangJob, WorkerSlot
    from tideflow.gangs import run_prefix
    from tideflow.storage.roots import gang_store

    logical_date = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    run_id = DagRun.generate_run_id(
        run_type=DagRunType.MANUAL, logical_date=logical_date, run_after=logical_date
    )
    gang = gang_id_for("retry-test", run_id, "train")
    store = gang_store(
        None, Settings.from_env().artifact_root, run_prefix("retry-test", run_id, "train")
    )
    backend = LocalBackend(Settings.from_env().home / "gangs")
    backend.submit(
        GangJob(
            gang,
            (sys.executable, WORKER),
            # the store the operator resolves for this step: the earlier try's workers commit
            {"GANG_TEST_MODE": "slow", "TIDEFLOW_CHECKPOINT_URI": store},
            (WorkerSlot(0, "localhost", (0,)), WorkerSlot(1, "localhost", (1,))),
            "cpu",
            False,
            0,
        )
    )
    dag_run = run_dag(pipeline(tmp_path, name="retry-test", mode="slow"), monkeypatch, logical_date)
    assert dag_run.run_id == run_id
    assert states(dag_run) == {"train": "success"}
    assert backend.log_path(gang).read_text().count("started 2 worker(s)") == 1


def alive(pid: int) -> bool:
    """Running: a zombie (exited, not yet reaped by its parent here) is not."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.usefixtures("airflow_home")
@pytest.mark.timeout(180)
def test_a_gang_step_past_its_timeout_stops_its_gang_and_frees_its_lease(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    record_property: Any,
) -> None:
    """The step's timeout (Airflow's execution_timeout) ends the whole gang, not just the
    task: workers, their supervisor and the lease."""
    started = time.monotonic()
    dag_run = run_dag(pipeline(tmp_path, mode="sleep", name="hangs", timeout="15s"), monkeypatch)
    elapsed = time.monotonic() - started
    record_property("seconds_from_start_to_end_with_a_15s_timeout", round(elapsed, 1))
    assert states(dag_run) == {"train": "failed"}
    assert "ran past its timeout (0:00:15)" in capfd.readouterr().out
    assert elapsed < 15 + 45  # the limit, one trigger poll, the workers' stop grace
    assert ledger().leases() == []
    gang = gang_id_for("hangs", dag_run.run_id, "train")
    backend = LocalBackend(Settings.from_env().home / "gangs")
    status = backend.status(gang)
    assert status is not None and str(status.state) == "cancelled"
    log = backend.log_path(gang).read_text()
    pids = [int(pid) for pid in re.findall(r"rank \d+: pid (\d+)", log)]
    supervisor = int((backend.gang_dir(gang) / "supervisor.pid").read_text())
    assert pids and not any(alive(pid) for pid in [*pids, supervisor])
