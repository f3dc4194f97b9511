"""The local backend with real processes: gang launch, restarts, preemption, reattach."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tideflow.backends import GangJob, GangState, WorkerSlot
from tideflow.backends.local import LocalBackend

pytestmark = pytest.mark.processes

WORKER = [sys.executable, str(Path(__file__).parents[1] / "gang_worker.py")]


def job(
    gang_id: str,
    mode: str,
    *,
    workers: int = 2,
    max_restarts: int = 2,
    device_class: str = "cpu",
    emulated: bool = False,
) -> GangJob:
    slots = tuple(
        WorkerSlot(rank, "localhost", (rank * 2, rank * 2 + 1)) for rank in range(workers)
    )
    return GangJob(
        gang_id=gang_id,
        command=tuple(WORKER),
        env={"GANG_TEST_MODE": mode},
        slots=slots,
        device_class=device_class,
        emulated=emulated,
        max_restarts=max_restarts,
        preempt_grace_s=10,
    )


def env_lines(backend: LocalBackend, gang_id: str) -> dict[int, dict[str, str]]:
    found = {}
    for line in backend.log_path(gang_id).read_text().splitlines():
        if line.startswith("[rank ") and "{" in line:
            data = json.loads(line.split("] ", 1)[1])
            found[int(data["RANK"])] = data
    return found


def wait_for_line(path: Path, text: str, count: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count(text) >= count:
            return
        time.sleep(0.05)
    raise TimeoutError(f"{text!r} x{count} not in {path}")


def test_gang_gets_the_torch_distributed_environment(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    backend.submit(job("dag/run/ok", "ok", device_class="gpu"))
    status = backend.wait("dag/run/ok", 60)
    assert status.state is GangState.SUCCEEDED, status
    assert status.device_seconds > 0  # 2 workers x 2 devices x their wall time
    envs = env_lines(backend, "dag/run/ok")
    assert sorted(envs) == [0, 1]
    assert {e["WORLD_SIZE"] for e in envs.values()} == {"2"}
    assert {e["MASTER_ADDR"] for e in envs.values()} == {"127.0.0.1"}
    assert len({e["MASTER_PORT"] for e in envs.values()}) == 1
    assert envs[0]["CUDA_VISIBLE_DEVICES"] == "0,1" and envs[1]["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert [envs[r]["LOCAL_RANK"] for r in (0, 1)] == ["0", "1"]


def test_emulated_devices_are_hidden_and_said_so(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    backend.submit(job("g/emulated", "ok", device_class="gpu", emulated=True))
    assert backend.wait("g/emulated", 60).state is GangState.SUCCEEDED
    envs = env_lines(backend, "g/emulated")
    assert envs[0]["CUDA_VISIBLE_DEVICES"] == "" and envs[0]["TIDEFLOW_EMULATED"] == "1"
    assert (
        "this machine has no GPU: the workers run emulated on the CPU"
        in backend.log_path("g/emulated").read_text()
    )


def test_a_dead_worker_restarts_the_whole_gang(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    backend.submit(job("g/flaky", "fail-once"))
    status = backend.wait("g/flaky", 60)
    assert status.state is GangState.SUCCEEDED and status.restarts == 1
    log = backend.log_path("g/flaky").read_text()
    assert "rank 1 died (exit code 3); stopping the whole gang" in log
    assert "restart 1 of 2" in log


def test_a_restart_of_a_gang_that_never_checkpoints_is_told_it_starts_over(
    tmp_path: Path,
) -> None:
    """The supervisor says what a restart resumes from, as the store shows it."""
    backend = LocalBackend(tmp_path / "gangs")
    store = (tmp_path / "ckpt").as_uri()
    plain = job("g/plain", "fail-once")
    env = {**plain.env, "TIDEFLOW_CHECKPOINT_URI": store, "GANG_TEST_CHECKPOINT": "0"}
    backend.submit(replace(plain, env=env))
    assert backend.wait("g/plain", 60).state is GangState.SUCCEEDED
    assert f"no checkpoint is committed in {store}: the workers start from the beginning" in (
        backend.log_path("g/plain").read_text()
    )


def test_restarts_are_bounded_and_the_failure_quotes_its_cause(tmp_path: Path) -> None:
    """A command naming a script that is not there, as a newcomer writes it: the gang
    fails once its restarts are used up, and its message says why."""
    backend = LocalBackend(tmp_path)
    missing = replace(job("g/broken", "ok", max_restarts=1), command=(sys.executable, "no.py"))
    backend.submit(missing)
    status = backend.wait("g/broken", 60)
    assert status.state is GangState.FAILED and status.restarts == 1
    assert "rank 0 died (exit code 2) and max_restarts=1 is used up" in status.message
    assert "can't open file" in status.message and "no.py" in status.message


def test_submit_twice_and_reattach_do_not_start_a_second_copy(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    backend.submit(job("g/long", "sleep"))
    wait_for_line(backend.log_path("g/long"), "ready", 2)
    pid = (backend.gang_dir("g/long") / "supervisor.pid").read_text()
    again = LocalBackend(tmp_path).submit(job("g/long", "sleep"))  # e.g. an Airflow retry
    assert again.state is GangState.RUNNING
    assert (backend.gang_dir("g/long") / "supervisor.pid").read_text() == pid
    reattached = LocalBackend(tmp_path).reattach("g/long")
    assert reattached is not None and reattached.state is GangState.RUNNING
    assert backend.log_path("g/long").read_text().count("started 2 worker(s)") == 1
    backend.cancel("g/long")
    assert backend.wait("g/long", 30).state is GangState.CANCELLED


def test_preempt_asks_workers_to_checkpoint_and_exit(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    backend.submit(job("g/preempt", "sleep"))
    wait_for_line(backend.log_path("g/preempt"), "ready", 2)
    backend.preempt("g/preempt")
    status = backend.wait("g/preempt", 30)
    assert status.state is GangState.PREEMPTED
    assert status.exit_codes == (75, 75)
    assert backend.reattach("g/preempt") is None


def test_cancel_right_after_submit_ends_cancelled(tmp_path: Path) -> None:
    """The cancel may reach a supervisor that is not yet running this module, or has no
    handler yet (the default action would kill it), or has started its workers: in every
    case the gang ends cancelled, never running on or unknown."""
    backend = LocalBackend(tmp_path)
    backend.submit(job("g/early", "sleep"))
    backend.cancel("g/early")
    assert backend.wait("g/early", 30).state is GangState.CANCELLED
    backend.submit(job("g/early", "ok"))  # a new submission is not cancelled by the old ask
    assert backend.wait("g/early", 60).state is GangState.SUCCEEDED


def test_a_killed_supervisor_is_reported_failed(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    backend.submit(job("g/orphan", "sleep"))
    wait_for_line(backend.log_path("g/orphan"), "ready", 2)
    pid = int((backend.gang_dir("g/orphan") / "supervisor.pid").read_text())
    os.kill(pid, 9)
    deadline = time.monotonic() + 10
    while (status := backend.status("g/orphan")) and not status.state.finished:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert status is not None and status.state is GangState.FAILED
    assert "supervisor process died" in status.message
    # Its workers live in their own sessions and outlive it; clean them up.
    for pid_text in re.findall(r"pid (\d+)", " ".join(status.events)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid_text), 9)
