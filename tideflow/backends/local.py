"""Local backend: a gang is a supervisor process on this machine that runs its workers.

The supervisor (``tideflow.backends.local_supervisor``) is started in its own
session so it outlives the Airflow task that submitted it: the operator defers
while the gang trains, and a retried task finds the same supervisor again
through the gang's directory instead of starting a second copy.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tideflow.backends import process_groups
from tideflow.backends.process_groups import KILL_WAIT_S
from tideflow.backends.protocol import GangJob, GangState, GangStatus
from tideflow.checkpoint import CHECKPOINT_URI_ENV
from tideflow.storage import unique_segment

REQUEST_FILE = "request"  # "cancel", "preempt" or "force": what was last asked of the gang
STOPPED_BEFORE_START = {
    "cancel": (GangState.CANCELLED, "cancelled before any worker started"),
    "preempt": (GangState.PREEMPTED, "preempted before any worker started; resumable"),
    "force": (GangState.PREEMPTED, "forced to stop before any worker started; resumable"),
}


def gang_dir_name(gang_id: str) -> str:
    return unique_segment(gang_id, 10)


def _alive(pid: int) -> bool:
    """A live supervisor with this pid (guards against pid reuse via the command line)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no procfs: trust kill(0)
    # Right after it is started, a process can show an empty command line for a
    # moment (its exec is still under way): that is our supervisor starting, and
    # taking it for dead would let a second submit start another one.
    if cmdline and b"tideflow.backends.local_supervisor" not in cmdline:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _gone(pid: int, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for the supervisor ``pid`` to end; whether it did."""
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(process_groups.POLL_S)
    return True


class LocalBackend:
    """Runs gangs as local processes; state lives under ``state_dir/<gang>/``."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir

    def gang_dir(self, gang_id: str) -> Path:
        return self.state_dir / gang_dir_name(gang_id)

    def _pid(self, gang_id: str) -> int | None:
        try:
            return int((self.gang_dir(gang_id) / "supervisor.pid").read_text())
        except (OSError, ValueError):
            return None

    def _read_status(self, gang_id: str) -> GangStatus | None:
        path = self.gang_dir(gang_id) / "status.json"
        try:
            return GangStatus.from_json(path.read_text())
        except FileNotFoundError:
            return None

    def status(self, gang_id: str) -> GangStatus | None:
        status = self._read_status(gang_id)
        pid = self._pid(gang_id)
        if status is None:
            if pid is not None and _alive(pid):
                return GangStatus(gang_id, GangState.PENDING, message="supervisor starting")
            requested = self._request(gang_id)
            if pid is not None and requested in STOPPED_BEFORE_START:
                # Stopped before its supervisor could start any worker.
                state, message = STOPPED_BEFORE_START[requested]
                return GangStatus(gang_id, state, message=message, finished_at=time.time())
            return None
        if not status.state.finished and (pid is None or not _alive(pid)):
            now = time.time()
            return GangStatus(
                gang_id,
                GangState.FAILED,
                status.restarts,
                "the gang's supervisor process died (machine restart or kill -9?)",
                status.exit_codes,
                status.started_at,
                now,
                status.events,
                status.device_seconds + self._unrecorded_seconds(gang_id, status, now),
            )
        return status

    def _unrecorded_seconds(self, gang_id: str, status: GangStatus, now: float) -> float:
        """The device time of the attempt a dead supervisor never recorded the end of:
        up to now, as its lease is charged until it is given back (its workers may
        have outlived it)."""
        job = self.job(gang_id)
        if status.attempt_started_at is None or job is None:
            return 0.0
        return max(0.0, now - status.attempt_started_at) * job.devices_held

    def _request(self, gang_id: str) -> str | None:
        try:
            return (self.gang_dir(gang_id) / REQUEST_FILE).read_text().strip()
        except FileNotFoundError:
            return None

    def job(self, gang_id: str) -> GangJob | None:
        """The job last submitted under ``gang_id`` (its command, env and slots)."""
        try:
            return GangJob.from_json((self.gang_dir(gang_id) / "job.json").read_text())
        except FileNotFoundError:
            return None

    def checkpoint_store(self, gang_id: str) -> str | None:
        """The checkpoint store the gang was given, if it was given one."""
        job = self.job(gang_id)
        return job.env.get(CHECKPOINT_URI_ENV) if job is not None else None

    def statuses(self) -> list[tuple[str, GangStatus]]:
        """Every gang with a state directory here, and its status."""
        found = []
        for job_file in sorted(self.state_dir.glob("*/job.json")):
            try:
                gang_id = GangJob.from_json(job_file.read_text()).gang_id
            except (OSError, ValueError, KeyError):
                continue
            status = self.status(gang_id)
            if status is not None:
                found.append((gang_id, status))
        return found

    def reattach(self, gang_id: str) -> GangStatus | None:
        status = self.status(gang_id)
        return status if status is not None and not status.state.finished else None

    @contextlib.contextmanager
    def _submitting(self, gang_id: str) -> Iterator[Path]:
        """Hold the gang's submit lock: one submitter at a time checks and starts it.

        Without it, two submitters (a retried task racing the first attempt, two
        triggerers) both see no live supervisor and both start one; the pid file
        then names one of them and cancel cannot reach the other. ``flock`` is
        released by the kernel if the holder dies, so a crash never wedges a gang.
        """
        directory = self.gang_dir(gang_id)
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / "submit.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield directory

    def submit(self, job: GangJob) -> GangStatus:
        with self._submitting(job.gang_id) as directory:
            return self._submit_locked(job, directory)

    def _submit_locked(self, job: GangJob, directory: Path) -> GangStatus:
        running = self.reattach(job.gang_id)
        if running is not None:
            return running
        previous = self.status(job.gang_id)
        if previous is not None and previous.state is GangState.SUCCEEDED:
            return previous
        (directory / "status.json").unlink(missing_ok=True)
        (directory / REQUEST_FILE).unlink(missing_ok=True)
        (directory / "job.json").write_text(job.to_json())
        with open(directory / "supervisor.log", "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "tideflow.backends.local_supervisor", str(directory)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ},
            )
        (directory / "supervisor.pid").write_text(str(process.pid))
        return GangStatus(job.gang_id, GangState.PENDING, message="supervisor started")

    def _signal(self, gang_id: str, signum: int, request: str) -> None:
        pid = self._pid(gang_id)
        if pid is None:
            return
        # The request is written before the signal: a supervisor still starting (not
        # yet this module's process, or without its handler) reads it once its
        # handlers are in place; one that dies of the signal first is reported
        # from it by status(). A supervisor already running gets the signal too.
        (self.gang_dir(gang_id) / REQUEST_FILE).write_text(request)
        if _alive(pid):
            os.kill(pid, signum)

    def cancel(self, gang_id: str) -> None:
        self._signal(gang_id, signal.SIGTERM, "cancel")

    def preempt(self, gang_id: str) -> None:
        self._signal(gang_id, signal.SIGUSR1, "preempt")

    def force(self, gang_id: str) -> None:
        """Kill the workers now, without the grace to checkpoint; the gang ends PREEMPTED."""
        self._signal(gang_id, signal.SIGUSR2, "force")

    def kill(self, gang_id: str, timeout_s: float = KILL_WAIT_S) -> bool:
        """Stop the gang now and make sure none of its processes runs; True once every
        one is seen dead (only then may its devices be granted again).

        Its supervisor is asked first (``force``): it kills every worker's process
        group and ends the gang preempted. A supervisor that is gone, or that has not
        done so within ``timeout_s``, is killed, and so is every worker process group
        it recorded (workers outlive their supervisor: each leads its own session).
        A gang that has ended already is only checked.
        """
        pid = self._pid(gang_id)
        if pid is not None and _alive(pid):
            self.force(gang_id)
            if not _gone(pid, timeout_s):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                _gone(pid, timeout_s)
        left = process_groups.kill_groups(process_groups.recorded(self.gang_dir(gang_id)))
        return not left and (pid is None or not _alive(pid))

    def log_path(self, gang_id: str) -> Path:
        return self.gang_dir(gang_id) / "gang.log"

    def wait(self, gang_id: str, timeout_s: float, poll_s: float = 0.2) -> GangStatus:
        """Block until the gang finishes (for tests and the CLI; operators defer instead)."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.status(gang_id)
            if status is not None and status.state.finished:
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"gang {gang_id} still {status and status.state} after {timeout_s:.0f}s"
                )
            time.sleep(poll_s)
