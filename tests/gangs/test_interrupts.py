"""Interrupts release everything: Ctrl-C or SIGTERM to ``tideflow run`` stops its gang
(workers and supervisor) and frees its lease; ``tideflow gangs`` lists and cancels gangs;
a waiting gang's message names who holds the devices.

Real processes throughout: the ``tideflow`` command line, Airflow's ``dag.test()`` inside
it, the local supervisor and tiny workers (tests/gang_worker.py), the SQLite ledger.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import airflow_home_from
from tideflow.backends import GangJob, WorkerSlot
from tideflow.backends.local import LocalBackend
from tideflow.gangs.control import gang_rows
from tideflow.inventory import detect_local
from tideflow.scheduling import GangRequest, Lease, LeaseLedger, Refusal

pytestmark = pytest.mark.processes

WORKER = str(Path(__file__).parents[1] / "gang_worker.py")


def alive(pid: int) -> bool:
    """Running: a zombie (exited, not yet reaped by its parent) is not."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def cli_env(home: Path) -> dict[str, str]:
    env = {**os.environ, "TIDEFLOW_HOME": str(home), "TIDEFLOW_BACKEND": "local"}
    env.pop("TIDEFLOW_CLUSTER_FILE", None)
    return env


def gangs(env: dict[str, str]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "tideflow.cli", "gangs", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def running_gangs(home: Path, backend: LocalBackend) -> list[str]:
    """The gangs of ``home`` that run, read as `tideflow gangs` reads them."""
    if not (home / "leases.db").exists():
        return []
    rows = gang_rows(LeaseLedger(home / "leases.db", detect_local()), backend)
    return [row.gang_id for row in rows if row.state == "running"]


def start_tideflow_run(
    pipeline: Path, env: dict[str, str], migrated_airflow_db: Path
) -> subprocess.Popen[str]:
    """``tideflow run PIPELINE`` as a user starts it, its output read as text, in the home
    ``env`` names, its Airflow DB a copy of ``migrated_airflow_db`` (tests/conftest.py),
    as on a user's second run: each test pays for its run and its interrupt."""
    # `tideflow run`'s default home
    airflow_home_from(migrated_airflow_db, Path(env["TIDEFLOW_HOME"]) / "airflow-run")
    return subprocess.Popen(
        [sys.executable, "-m", "tideflow.cli", "run", str(pipeline)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


# Longer than the waits inside add up to (the gang's start 180 s, a last `tideflow
# gangs` call 60 s, the exit 60 s), so a slow start fails on the assertion that says so
# rather than on the timeout.
# `tideflow run` turns SIGINT and SIGTERM into one interrupt of its child (one handler,
# tideflow.dag.local_run.run_interruptibly), so each signal is sent in one of the two
# situations: SIGTERM (a service manager's stop) while a gang runs, SIGINT (Ctrl-C)
# while a data-prep step runs.
@pytest.mark.timeout(420)
def test_sigterm_to_tideflow_run_stops_its_gang_and_frees_its_lease(
    tmp_path: Path, migrated_airflow_db: Path
) -> None:
    signum = signal.SIGTERM
    pipeline = tmp_path / "sleepy.yaml"
    pipeline.write_text(
        textwrap.dedent(f"""\
        apiVersion: tideflow/v1
        kind: Pipeline
        metadata: {{name: sleepy, team: qa}}
        steps:
          - name: train
            gang_training:
              entrypoint: [python, {WORKER}]
              env: {{GANG_TEST_MODE: sleep}}
              workers: 2
              checkpoint: {{optional: true}}
        """)
    )
    home = tmp_path / "home"
    env = cli_env(home)
    run = start_tideflow_run(pipeline, env, migrated_airflow_db)
    try:
        deadline = time.monotonic() + 180
        backend = LocalBackend(home / "gangs")
        # Waited for in this process: a `tideflow gangs` process every half second would
        # take a core from the start it waits for. The command is asked once it runs.
        while not running_gangs(home, backend):
            assert run.poll() is None and time.monotonic() < deadline, "the gang never ran"
            time.sleep(0.5)
        (row,) = gangs(env)
        assert row["team"] == "qa" and row["devices"] == 2 and row["holder"]
        assert row["gang_id"].startswith("sleepy/") and row["gang_id"].endswith("/train")
        log = backend.log_path(row["gang_id"]).read_text()
        pids = [int(pid) for pid in re.findall(r"rank \d+: pid (\d+)", log)]
        supervisor = int((backend.gang_dir(row["gang_id"]) / "supervisor.pid").read_text())
        interrupted = time.monotonic()
        run.send_signal(signum)
        output, _ = run.communicate(timeout=60)
    finally:
        run.kill()
    released = time.monotonic() - interrupted
    print(f"{signal.Signals(signum).name} to tideflow run: exited {released:.1f}s later")
    assert run.returncode == 130, output[-3000:]
    assert released < 45  # the workers' stop grace and a margin
    assert "tideflow: interrupted: gang sleepy/" in output
    assert not any(alive(pid) for pid in [*pids, supervisor])
    assert gangs(env) == []  # nothing holds, waits or runs
    assert LeaseLedger(home / "leases.db", detect_local()).leases() == []


@pytest.mark.timeout(300)
def test_ctrl_c_during_a_running_step_ends_the_run_as_interrupted_and_stops_its_process(
    tmp_path: Path, migrated_airflow_db: Path
) -> None:
    """A data-prep step runs its entry point in a child process, and the task inside
    ``dag.test()`` gets the interrupt as KeyboardInterrupt, which Airflow's task runner
    turns into the task's failure. The run must still end as interrupted (130), not as
    failed, and the entry point's process must not be left running."""
    (tmp_path / "slowstep.py").write_text(
        textwrap.dedent("""\
        import os, time
        from pathlib import Path

        def wait(*args, **kwargs):
            Path(os.environ["SLOW_MARKER"]).write_text(str(os.getpid()))
            time.sleep(120)
            return {}
        """)
    )
    pipeline = tmp_path / "slow.yaml"
    pipeline.write_text(
        textwrap.dedent("""\
        apiVersion: tideflow/v1
        kind: Pipeline
        metadata: {name: slow, team: qa}
        steps:
          - name: prepare
            data_prep: {entrypoint: "slowstep:wait"}
        """)
    )
    marker = tmp_path / "marker"
    env = {
        **cli_env(tmp_path / "home"),
        "PYTHONPATH": str(tmp_path),
        "SLOW_MARKER": str(marker),
    }
    run = start_tideflow_run(pipeline, env, migrated_airflow_db)
    try:
        deadline = time.monotonic() + 180
        while not marker.exists() or not marker.read_text():
            assert run.poll() is None and time.monotonic() < deadline, "the step never ran"
            time.sleep(0.2)
        step_pid = int(marker.read_text())
        run.send_signal(signal.SIGINT)
        output, _ = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 130, output[-3000:]
    assert "pipeline slow: interrupted" in output
    deadline = time.monotonic() + 15  # the step's process group gets its stop grace
    while alive(step_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(step_pid)


def test_tideflow_gangs_cancel_stops_a_gang_and_releases_its_lease(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = cli_env(home)
    ledger = LeaseLedger(home / "leases.db", detect_local())
    lease = ledger.try_acquire(GangRequest("p/r/train", "vision", "cpu", None, 1, 1), "me", 600)
    assert isinstance(lease, Lease)
    backend = LocalBackend(home / "gangs")
    backend.submit(
        GangJob(
            "p/r/train",
            (sys.executable, WORKER),
            {"GANG_TEST_MODE": "sleep"},
            (WorkerSlot(0, "localhost", (0,)),),
            "cpu",
            False,
            0,
            team="vision",
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "tideflow.cli", "gangs", "cancel", "p/r/train"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "gang p/r/train: cancelled; lease released"
    assert ledger.leases() == [] and gangs(env) == []


def test_a_waiting_gang_is_told_which_gangs_hold_the_devices(tmp_path: Path) -> None:
    ledger = LeaseLedger(tmp_path / "leases.db", detect_local())
    cores = detect_local().total("cpu")
    holder = ledger.try_acquire(
        GangRequest("big/r1/train", "research", "cpu", None, cores, 1), "host:42:airflow", 600
    )
    assert isinstance(holder, Lease)
    waiting = ledger.try_acquire(
        GangRequest("small/r2/train", "vision", "cpu", None, 1, 1), "x", 60
    )
    assert isinstance(waiting, Refusal) and not waiting.never
    assert re.search(
        rf"held by big/r1/train \(team research, {cores} device\(s\), holder host:42:airflow, "
        r"for \d+s\)",
        waiting.reason,
    ), waiting.reason
    rows = gang_rows(ledger, LocalBackend(tmp_path / "gangs"))
    assert [(row.gang_id, row.state) for row in rows] == [
        ("big/r1/train", "leased"),
        ("small/r2/train", "waiting"),
    ]
