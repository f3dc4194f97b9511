"""Running a framework's training script as a real 2-worker gang through the local backend.

Shared by tests/gangs/test_hf_integration.py and tests/gangs/test_lightning_integration.py:
the supervisor starts, restarts and preempts the gang as in production.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

from tideflow.backends import GangJob, GangState, WorkerSlot
from tideflow.backends.local import LocalBackend
from tideflow.checkpoint import CheckpointManager

WORKERS = 2


def gang(
    gang_id: str,
    script: Path,
    root: Path,
    env: dict[str, str],
    *,
    extra: tuple[str, ...] = (),
    max_restarts: int = 0,
) -> GangJob:
    """``script`` run by two ranks; reports go to ``root/out``, its own files to ``root/work``."""
    return GangJob(
        gang_id=gang_id,
        command=(
            sys.executable,
            str(script),
            "--output-dir",
            str(root / "work"),
            "--out",
            str(root / "out"),
            *extra,
        ),
        env=env,
        slots=tuple(WorkerSlot(rank, "localhost", ()) for rank in range(WORKERS)),
        device_class="cpu",
        emulated=False,
        max_restarts=max_restarts,
    )


def run(backend: LocalBackend, job: GangJob, timeout_s: float = 120) -> str:
    """Submit ``job``, wait for it to succeed; its log."""
    backend.submit(job)
    status = backend.wait(job.gang_id, timeout_s)
    log = backend.log_path(job.gang_id).read_text()
    assert status.state is GangState.SUCCEEDED, log[-4000:]
    return log


def report(root: Path) -> dict[str, Any]:
    """Rank 0's report; every rank must have ended with the same weights."""
    ranks = [json.loads((root / "out" / f"rank-{r}.json").read_text()) for r in range(WORKERS)]
    assert len({r["weights_sha256"] for r in ranks}) == 1, ranks
    return ranks[0]  # type: ignore[no-any-return]


def policy(store: str, every_steps: int = 5) -> dict[str, str]:
    return {"TIDEFLOW_CHECKPOINT_URI": store, "TIDEFLOW_CHECKPOINT_EVERY_STEPS": str(every_steps)}


def wait_for_checkpoint(store: str, at_least: int, timeout_s: float = 90) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        manifest = CheckpointManager(store).latest(verify=False)
        if manifest is not None and manifest.step >= at_least:
            return manifest.step
        time.sleep(0.05)
    raise TimeoutError(f"no checkpoint at step >= {at_least} in {store}")


def wait_for_log(backend: LocalBackend, gang_id: str, pattern: str, timeout_s: float = 90) -> str:
    log = backend.log_path(gang_id)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        if re.search(pattern, text):
            return text
        time.sleep(0.05)
    raise TimeoutError(f"{pattern!r} never appeared in {log}")


def kill_rank(backend: LocalBackend, gang_id: str, rank: int) -> None:
    """SIGKILL one worker of the gang's current attempt, as a node failure would."""
    text = backend.log_path(gang_id).read_text()
    pid = int(re.findall(rf"rank {rank}: pid (\d+)", text)[-1])
    os.kill(pid, signal.SIGKILL)


def preempt_and_wait(backend: LocalBackend, gang_id: str) -> tuple[Any, str]:
    backend.preempt(gang_id)
    status = backend.wait(gang_id, 90)
    return status, backend.log_path(gang_id).read_text()


class Interrupted(NamedTuple):
    """What one gang lived through in ``killed_then_preempted``."""

    resumed: int  # the step the supervisor's restart resumed from, after the SIGKILL
    preempted: int  # the step SIGTERM stopped the restarted gang at, and committed
    log: str  # the first submission's log: the kill, the restart, the preemption


def killed_then_preempted(
    backend: LocalBackend, script: Path, root: Path, *, kill_after: int, steps: int
) -> Interrupted:
    """One gang through both interruptions a cluster deals, each answered as in production.

    Rank 1 is killed (SIGKILL, a node lost) once a periodic checkpoint of step
    ``kill_after`` or later is committed: the supervisor restarts the gang from its newest
    committed checkpoint. Once the restarted gang has committed again it is preempted
    (SIGTERM): every rank exits 75 after committing the step it stopped at. The gang is then
    submitted again, uninterrupted, and must resume from that step and finish.
    """
    store = (root / "ckpt").as_uri()
    env = policy(store)
    backend.submit(gang("story", script, root, env, extra=("--step-sleep", "0.1"), max_restarts=1))
    reached = wait_for_checkpoint(store, kill_after)
    kill_rank(backend, "story", 1)
    restarted = r"resumed from checkpoint step (\d+) \(restart 1\)"
    found = re.search(restarted, wait_for_log(backend, "story", restarted, timeout_s=180))
    assert found is not None
    resumed = int(found.group(1))
    assert kill_after <= reached <= resumed < steps and resumed % 5 == 0
    wait_for_checkpoint(store, resumed + 5)  # the restarted gang trains on

    status, log = preempt_and_wait(backend, "story")
    assert status.state is GangState.PREEMPTED and status.restarts == 1, log[-4000:]
    assert status.exit_codes == (75, 75), log[-4000:]
    assert f"relaunching; the newest committed checkpoint is step {resumed}" in log
    committed = CheckpointManager(store).latest()
    assert committed is not None and resumed < committed.step < steps
    assert re.search(rf"rank 0: preempted \(SIGTERM\) at step {committed.step}; checkpoint ", log)
    assert re.search(rf"rank 1: preempted \(SIGTERM\) at step {committed.step}; ", log)

    run(backend, gang("story", script, root, env))  # the devices are back
    resubmitted = backend.log_path("story").read_text()
    assert f"resumed from checkpoint step {committed.step} (restart 0)" in resubmitted
    return Interrupted(resumed, committed.step, log)


class Whole(NamedTuple):
    """An uninterrupted run with a checkpoint store and a step's MLflow run."""

    root: Path  # the gang's reports (``report``)
    store: str  # its checkpoint store
    run_id: str  # the step's MLflow run it logged into
    log: str


def whole_run(root: Path, script: Path, mlflow_url: str, experiment: str) -> Whole:
    """``script`` run uninterrupted as a gang step runs it: checkpointed, and tracked."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_url)
    run_id = client.create_run(client.create_experiment(experiment)).info.run_id
    store = (root / "ckpt").as_uri()
    env = {**policy(store), "MLFLOW_TRACKING_URI": mlflow_url, "MLFLOW_RUN_ID": run_id}
    log = run(LocalBackend(root / "gangs"), gang("whole", script, root, env))
    return Whole(root, store, run_id, log)
