"""Supervise one gang on this machine: start all workers, restart all on any failure.

``python -m tideflow.backends.local_supervisor GANG_DIR`` (started by
``LocalBackend``). torchrun semantics: if any worker dies, the whole gang is
stopped and started again (from the newest committed checkpoint, which the
training runtime finds by itself), up to ``max_restarts`` times, unless the
restart failed exactly as the attempt before it (``tideflow.backends.failures``).

Exit codes of workers that mean something here:
  75  preempted after committing a checkpoint: resumable, never restarted here
  76  stopped by the training-health guard: restarting would not help
  77  hung (no progress for hang_timeout; the stacks are in its log): restarted,
      unless the restart hangs at the same step
Signals to the supervisor: SIGTERM cancels the gang, SIGUSR1 preempts it, SIGUSR2
forces it to stop now (a preemption whose grace is over: its workers are killed,
and the gang ends preempted, resumable from its newest checkpoint).

Whatever ends an attempt, every worker's whole process group is killed and seen
dead before the next attempt starts or the gang's lease is given back
(``tideflow.backends.process_groups``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import IO

from tideflow.backends import process_groups
from tideflow.backends.failures import FailureSignature, first_cause, is_deterministic, signature
from tideflow.backends.process_groups import Group
from tideflow.backends.protocol import GangJob, GangState, GangStatus
from tideflow.backends.supervisor_lease import LeaseRenewal
from tideflow.backends.worker_env import free_port, worker_env
from tideflow.config import EXIT_HUNG, PROGRESS_FILE_ENV

EXIT_PREEMPTED = 75
EXIT_UNHEALTHY = 76
POLL_S = 0.1
STOP_GRACE_S = 10.0
# A request is not replaced by a gentler one: a forced stop stays forced.
_STRENGTH = {"preempt": 1, "preempting": 1, "cancel": 2, "force": 3}


class Supervisor:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.job = GangJob.from_json((directory / "job.json").read_text())
        self.restarts = 0
        self.events: list[str] = []
        self.started_at = time.time()
        self.workers: list[subprocess.Popen[str]] = []
        self.request: str | None = None  # "cancel", "preempt" or "force"
        self.no_grace = False  # the lease was lost while stopping: kill, do not wait
        self.forced_at: float | None = None  # when a stop without grace killed the workers
        self.groups: list[Group] = []  # this attempt's workers' process groups
        self.device_seconds = 0.0
        self.attempt_started: float | None = None
        self.devices = self.job.devices_held
        self.lease = LeaseRenewal(self.job)
        self.log_lock = threading.Lock()
        self.gang_log = open(directory / "gang.log", "a", encoding="utf-8")  # noqa: SIM115
        self.pumps: list[threading.Thread] = []
        self.log_offsets: dict[int, int] = {}  # where each rank's log of this attempt starts
        self.last_failure: FailureSignature | None = None

    def event(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        self.events.append(f"{stamp} {text}")
        self.log_line(f"[supervisor] {text}")

    def log_line(self, line: str) -> None:
        with self.log_lock:
            self.gang_log.write(line + "\n")
            self.gang_log.flush()

    def write_status(self, state: GangState, message: str = "") -> None:
        codes = tuple(w.poll() for w in self.workers)
        status = GangStatus(
            self.job.gang_id,
            state,
            self.restarts,
            message,
            codes,
            self.started_at,
            time.time() if state.finished else None,
            tuple(self.events[-50:]),
            self.device_seconds + self._running_seconds() * self.devices,
            self.attempt_started,
        )
        tmp = self.directory / "status.json.tmp"
        tmp.write_text(status.to_json())
        os.replace(tmp, self.directory / "status.json")

    def _running_seconds(self) -> float:
        return 0.0 if self.attempt_started is None else time.time() - self.attempt_started

    def _pump(self, rank: int, stream: IO[str]) -> None:
        with open(self.directory / f"rank-{rank}.log", "a", encoding="utf-8") as own:
            for line in stream:
                text = line.rstrip("\n")
                own.write(text + "\n")
                own.flush()
                self.log_line(f"[rank {rank}] {text}")

    def progress_path(self, rank: int) -> Path:
        return self.directory / f"progress-rank-{rank}.json"

    def launch(self) -> None:
        port = free_port()
        attempt = uuid.uuid4().hex  # the receipts of this launch (runtime.gang_commit)
        self.workers = []
        self.pumps = []
        self.groups = []
        self.attempt_started = time.time()
        for slot in self.job.slots:
            # a progress file left by the last attempt would be read as this one's
            self.progress_path(slot.rank).unlink(missing_ok=True)
            log = self.directory / f"rank-{slot.rank}.log"
            self.log_offsets[slot.rank] = log.stat().st_size if log.exists() else 0
            env = worker_env(self.job, slot, port, self.restarts)
            env[PROGRESS_FILE_ENV] = str(self.progress_path(slot.rank))
            env["TIDEFLOW_ATTEMPT_ID"] = attempt
            process = subprocess.Popen(
                list(self.job.command),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
                errors="replace",
                start_new_session=True,
            )
            assert process.stdout is not None
            pump = threading.Thread(
                target=self._pump, args=(slot.rank, process.stdout), daemon=True
            )
            pump.start()
            self.pumps.append(pump)
            self.workers.append(process)
            self.groups.append(Group.of(process.pid))
            # recorded as each starts: whoever must stop the gang without this
            # supervisor finds every group it started
            process_groups.record(self.directory, self.groups)
        pids = ", ".join(
            f"rank {s.rank}: pid {w.pid}" for s, w in zip(self.job.slots, self.workers, strict=True)
        )
        self.event(f"started {self.job.workers} worker(s) (attempt {self.restarts + 1}; {pids})")
        self.write_status(GangState.RUNNING)

    def signal_all(self, signum: int) -> None:
        # the whole group, also when its leader is gone: what it started may not be
        process_groups.signal_groups(self.groups, signum)

    def stop_all(self, grace_s: float, *, terminate: bool = True) -> None:
        """Stop every worker; with terminate=False only wait (they are already leaving).

        The workers get ``grace_s`` (cut short by a forced stop), then every group is
        killed, whatever its leader did, and the attempt ends once all are seen dead.
        """
        if terminate:
            self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(w.poll() is None for w in self.workers):
            if self.request == "force" or self.no_grace:
                break
            time.sleep(POLL_S)
            self.renew_lease()  # the devices stay this gang's until its processes are gone
        left = process_groups.kill_groups(self.groups, reap=self._reap)
        for worker in self.workers:
            worker.wait()
        if self.request == "force" or self.no_grace:
            self.forced_at = time.time()  # the work since the newest checkpoint is lost
        if left:
            self.event(
                "process group(s) "
                + ", ".join(str(g.pgid) for g in left)
                + " still have live processes after SIGKILL (stuck in the kernel?)"
            )
        self._end_attempt()

    def _reap(self) -> None:
        for worker in self.workers:
            worker.poll()

    def _end_attempt(self) -> None:
        self.device_seconds += self._running_seconds() * self.devices
        self.attempt_started = None

    def renew_lease(self) -> None:
        """The supervisor holds the gang's lease: it lives exactly as long as the gang."""
        if self.lease.renew():
            return
        if self.request is None:
            self.event("the gang's lease was lost (expired or taken back): preempting")
            self.request = "preempt"
        elif not self.no_grace:
            # Its devices may be granted to another gang now: a stop must not wait.
            self.event("the gang's lease was lost while it was stopping: killing its workers")
            self.no_grace = True

    def _restart_or_fail(self, failed: list[tuple[int, int]]) -> GangState | None:
        """Stop the gang after ``failed``; restart it (None) or end it failed."""
        rank, code = failed[0]
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        if code == EXIT_HUNG:
            how = "hung: no training progress for its hang_timeout; stacks in its log"
        self.event(f"rank {rank} died ({how}); stopping the whole gang")
        self.stop_all(STOP_GRACE_S)
        failure = self.failure(failed)
        if is_deterministic(self.last_failure, failure):
            left = self.job.max_restarts - self.restarts
            self.event(
                f"the restart failed the same way ({failure.describe()}): "
                f"not using the {left} restart(s) left"
            )
            self.write_status(
                GangState.FAILED,
                f"{failure.describe()} on two attempts in a row; a restart would fail "
                f"again, so the gang stopped (its log has the traceback){failure.printed()}",
            )
            return GangState.FAILED
        self.last_failure = failure
        if self.restarts >= self.job.max_restarts:
            self.write_status(
                GangState.FAILED,
                f"rank {rank} died ({how}) and max_restarts={self.job.max_restarts} is used "
                f"up{failure.printed()}",
            )
            return GangState.FAILED
        self.restarts += 1
        self.event(
            f"restart {self.restarts} of {self.job.max_restarts}: relaunching; "
            f"{self.resume_point()}"
        )
        self.launch()
        return None

    def failure(self, failed: list[tuple[int, int]]) -> FailureSignature:
        """This attempt's failure, from its first failed ranks' logs and progress."""
        for pump in self.pumps:  # the last lines of the dead workers' output
            pump.join(timeout=2.0)
        codes = dict(failed)
        for slot, worker in zip(self.job.slots, self.workers, strict=True):
            code = worker.poll()
            if code is not None and code > 0:  # also died by itself while we stopped the rest
                codes.setdefault(slot.rank, code)
        signatures = []
        for rank, code in sorted(codes.items()):
            log = self.directory / f"rank-{rank}.log"
            with open(log, encoding="utf-8", errors="replace") as handle:
                handle.seek(self.log_offsets.get(rank, 0))
                text = handle.read()
            signatures.append(signature(rank, code, text, self.progress_path(rank)))
        return first_cause(signatures)

    def resume_point(self) -> str:
        """Where the relaunched workers will resume, as the store shows it now."""
        uri = self.job.env.get("TIDEFLOW_CHECKPOINT_URI")
        if not uri:
            return "the gang has no checkpoint store: the workers start from the beginning"
        from tideflow.checkpoint import CheckpointManager

        try:
            manifest = CheckpointManager(uri).latest(verify=False)
        except Exception as exc:  # the workers will say more when they try
            return f"the checkpoint store {uri} cannot be read ({exc})"
        if manifest is None:
            return (
                f"no checkpoint is committed in {uri}: the workers start from the "
                "beginning (a script resumes only if it saves through tideflow.checkpoints)"
            )
        return f"the newest committed checkpoint is step {manifest.step}"

    def run(self) -> GangState:
        try:
            return self._run()
        finally:
            # Whatever ended it (an error too), no process of the gang may outlive its
            # lease; one that SIGKILL cannot end keeps the lease until it expires.
            if not process_groups.kill_groups(self.groups, reap=self._reap):
                self.lease.release(forced_at=self.forced_at)

    def _ask(self, request: str) -> None:
        """Take a request unless a stronger one is being carried out."""
        if _STRENGTH[request] > _STRENGTH.get(self.request or "", 0):
            self.request = request

    def _listen(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self._ask("cancel"))
        signal.signal(signal.SIGUSR1, lambda *_: self._ask("preempt"))
        signal.signal(signal.SIGUSR2, lambda *_: self._ask("force"))
        # A request that came before the handlers were in place (see LocalBackend._signal).
        with contextlib.suppress(FileNotFoundError):
            asked = (self.directory / "request").read_text().strip()
            if asked in ("cancel", "preempt", "force"):
                self._ask(asked)

    def _answer_request(self) -> GangState | None:
        """Carry out what was asked of the gang; its end state when that ends it."""
        if self.request == "force" or (self.request == "preempting" and self.no_grace):
            self.event("forced to stop: killing every worker's process group")
            self.stop_all(0.0, terminate=False)
            self.write_status(
                GangState.PREEMPTED,
                "forced to stop: still running when its grace to checkpoint ended (or its "
                "lease was lost); resumable from its newest checkpoint, the work since is lost",
            )
            return GangState.PREEMPTED
        if self.request == "cancel":
            self.event("cancel requested: stopping all workers")
            self.stop_all(STOP_GRACE_S)
            self.write_status(GangState.CANCELLED, "cancelled on request")
            return GangState.CANCELLED
        if self.request == "preempt":
            self.request = "preempting"
            self.event("preemption requested: asking workers to checkpoint and exit")
            self.signal_all(signal.SIGTERM)
        return None

    def _run(self) -> GangState:
        self._listen()
        if self.job.emulated:
            self.event(
                f"this machine has no {self.job.device_class.upper()}: the workers run "
                "emulated on the CPU"
            )
        self.launch()
        while True:
            time.sleep(POLL_S)
            self.renew_lease()
            answered = self._answer_request()
            if answered is not None:
                return answered
            codes = [w.poll() for w in self.workers]
            if all(code == 0 for code in codes):
                self.stop_all(0.0, terminate=False)  # what the workers left running
                self.event("all workers finished")
                self.write_status(GangState.SUCCEEDED)
                return GangState.SUCCEEDED
            if EXIT_PREEMPTED in codes or (
                self.request == "preempting" and all(c is not None for c in codes)
            ):
                # The ranks agreed to stop and are committing their checkpoint: a
                # second SIGTERM could land during interpreter shutdown, so only wait.
                self.stop_all(self.job.preempt_grace_s, terminate=False)
                self.event("workers exited after a preemption checkpoint")
                self.write_status(GangState.PREEMPTED, "preempted; resumable from checkpoint")
                return GangState.PREEMPTED
            failed = [
                (s.rank, c)
                for s, c in zip(self.job.slots, codes, strict=True)
                if c not in (None, 0)
            ]
            if not failed:
                continue
            rank, code = failed[0]
            if code == EXIT_UNHEALTHY:
                self.stop_all(STOP_GRACE_S)
                self.event(f"rank {rank} stopped by the training-health guard")
                self.write_status(
                    GangState.FAILED,
                    "training-health guard stopped the run; "
                    "see the worker log for the step and value",
                )
                return GangState.FAILED
            ended = self._restart_or_fail(failed)
            if ended is not None:
                return ended


def main(argv: list[str]) -> int:
    supervisor = Supervisor(Path(argv[0]))
    state = supervisor.run()
    return 0 if state is GangState.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
