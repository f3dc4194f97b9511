"""Killing a worker's whole process group, and knowing it is gone.

Each worker is started as the leader of its own session, so what it starts (data
loaders, a launcher's children) shares its group. Signalling only the leader, or
only while the leader lives, leaves those on the devices; so does trusting a
SIGKILL without looking afterwards. A gang's devices may go to another lease only
once every group of it has no live member.

The groups a supervisor starts are recorded in the gang's directory (one line
per worker: its pid and its start time), so that whoever has to stop a gang whose
supervisor is gone can still find them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

GROUPS_FILE = "worker-groups"
KILL_WAIT_S = 10.0  # a SIGKILLed process is gone in milliseconds, unless stuck in the kernel
POLL_S = 0.05


def started_at(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (None: no such process, or
    no procfs): with the pid, it names one process for as long as the machine runs."""
    fields = _stat(Path(f"/proc/{pid}"))
    return fields[19] if fields is not None and len(fields) > 19 else None


@dataclass(frozen=True)
class Group:
    """A worker's process group: its leader's pid (the group's id) and start time."""

    pgid: int
    start: str | None

    @classmethod
    def of(cls, pid: int) -> Group:
        return cls(pid, started_at(pid))

    def ours(self) -> bool:
        """Whether the id still names this group. A group outlives its leader, and its
        id is not given to a new process while it has members; a live leader with
        another start time is another process that got the pid, to be left alone."""
        now = started_at(self.pgid)
        return self.start is None or now is None or now == self.start


def record(directory: Path, groups: Iterable[Group]) -> None:
    """Record this attempt's groups (they replace the last attempt's, which were
    seen dead before this one started)."""
    lines = [f"{g.pgid} {g.start or '-'}\n" for g in groups]
    tmp = directory / f"{GROUPS_FILE}.tmp"
    tmp.write_text("".join(lines))
    os.replace(tmp, directory / GROUPS_FILE)


def recorded(directory: Path) -> list[Group]:
    """The groups recorded in ``directory`` that are still ours."""
    try:
        lines = (directory / GROUPS_FILE).read_text().splitlines()
    except FileNotFoundError:
        return []
    groups = []
    for line in filter(None, lines):
        pid, start = line.split()
        groups.append(Group(int(pid), None if start == "-" else start))
    return [g for g in groups if g.ours()]


def group_alive(pgid: int) -> bool:
    """Whether the group has a running member (a zombie, exited but not yet reaped, is
    not one). As ``tideflow.stack.processes.group_alive``, which this layer may not use."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path("/proc")
    if not proc.is_dir():
        return True  # no procfs: a zombie cannot be told from a running process
    leader = _stat(proc / str(pgid))
    if leader is not None and leader[0] != "Z":
        return True
    for entry in proc.iterdir():
        fields = _stat(entry) if entry.name.isdigit() else None
        if fields is not None and int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _stat(entry: Path) -> list[str] | None:
    """A process's /proc stat fields from its state on (None: it has ended)."""
    try:
        return (entry / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def signal_groups(groups: Iterable[Group], signum: int) -> None:
    for group in groups:
        if group.ours():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group.pgid, signum)


def alive(groups: Iterable[Group]) -> list[Group]:
    """The groups with a member still running (a zombie is not)."""
    return [g for g in groups if g.ours() and group_alive(g.pgid)]


def kill_groups(
    groups: Iterable[Group],
    timeout_s: float = KILL_WAIT_S,
    *,
    reap: Callable[[], None] = lambda: None,
) -> list[Group]:
    """SIGKILL every group and wait until none has a live member; the groups still
    alive after ``timeout_s`` are returned (empty: all seen dead). ``reap`` collects
    the exit of the processes the caller started, while it waits."""
    targets = list(groups)
    signal_groups(targets, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while True:
        reap()
        left = alive(targets)
        if not left or time.monotonic() >= deadline:
            return left
        signal_groups(left, signal.SIGKILL)  # a member forked after the first signal
        time.sleep(POLL_S)
