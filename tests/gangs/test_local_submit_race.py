"""One gang, one supervisor: parallel submits of the same gang start it exactly once.

Four processes submit the same gang at the same instant (a barrier releases
them), twenty rounds; after each round the process table must hold one
supervisor for the gang and one set of workers, and the recorded pid must be
that supervisor's, so cancel stops everything that was started.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.gangs.test_local_backend import job, wait_for_line
from tideflow.backends import GangState
from tideflow.backends.local import LocalBackend

pytestmark = pytest.mark.processes

PROCESSES = 4
ROUNDS = 20


def _submit_rounds(state_dir: str, sync: Any) -> None:
    barrier, done = sync
    backend = LocalBackend(Path(state_dir))
    for round_index in range(ROUNDS):
        gang = job(f"race/{round_index}", "sleep", workers=1)
        gang.env["GANG_RACE_ROUND"] = f"{os.getppid()}-{round_index}"
        barrier.wait(timeout=60)
        backend.submit(gang)
        done.put(round_index)
        barrier.wait(timeout=120)  # the parent counts processes before the next round


def _processes_with(marker: bytes, source: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / source).read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in text and state != "Z":
            found.append(int(entry.name))
    return found


def test_parallel_submits_start_one_supervisor_and_one_set_of_workers(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    context = multiprocessing.get_context("fork")
    barrier, done = context.Barrier(PROCESSES + 1), context.Queue()
    submitters = [
        context.Process(target=_submit_rounds, args=(str(tmp_path), (barrier, done)))
        for _ in range(PROCESSES)
    ]
    for process in submitters:
        process.start()
    counts: list[tuple[int, int, bool]] = []
    details: list[str] = []
    try:
        for round_index in range(ROUNDS):
            gang_id = f"race/{round_index}"
            barrier.wait(timeout=60)
            for _ in range(PROCESSES):
                done.get(timeout=60)
            wait_for_line(backend.log_path(gang_id), "ready", 1)
            time.sleep(0.5)  # room for a second supervisor's worker to show up
            directory = str(backend.gang_dir(gang_id)).encode()
            supervisors = _processes_with(directory, "cmdline")
            workers = _processes_with(
                f"GANG_RACE_ROUND={os.getpid()}-{round_index}".encode(), "environ"
            )
            workers = [pid for pid in workers if pid not in supervisors]
            recorded = int((backend.gang_dir(gang_id) / "supervisor.pid").read_text())
            counts.append((len(supervisors), len(workers), supervisors == [recorded]))
            if counts[-1] != (1, 1, True):
                details.append(_describe(round_index, supervisors + workers, backend, gang_id))
            backend.cancel(gang_id)
            assert backend.wait(gang_id, 30).state is GangState.CANCELLED
            barrier.wait(timeout=60)
    finally:
        for process in submitters:
            process.join(timeout=30)
        # A second supervisor (the defect) is one cancel never reaches: stop what we started.
        leftovers = _processes_with(str(tmp_path).encode(), "cmdline")
        leftovers += _processes_with(f"GANG_RACE_ROUND={os.getpid()}-".encode(), "environ")
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert counts == [(1, 1, True)] * ROUNDS, "\n".join(details)


def _describe(round_index: int, pids: list[int], backend: LocalBackend, gang_id: str) -> str:
    """What the process table and the gang's log said when a round went wrong."""
    lines = [f"round {round_index}:"]
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        lines.append(f"  pid {pid} state {stat[0]} ppid {stat[1]}: {cmdline}")
    lines.append(backend.log_path(gang_id).read_text())
    return "\n".join(lines)
