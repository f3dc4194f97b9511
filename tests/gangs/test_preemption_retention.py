"""A checkpoint written on preemption counts toward ``keep_last`` like any other.

A preempted gang commits its state off the policy's cadence and resumes from it.
The attempt that resumes must prune it as soon as ``keep_last`` newer ones are
committed; before, that attempt protected the checkpoint it resumed from for as
long as it ran, so a run that finished after a preemption kept it forever. Both
ways a script saves are tested in this process: ``tideflow.checkpoints()`` and
the framework integrations' ``GangCheckpoints``.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tideflow.checkpoint import CheckpointManager
from tideflow.integrations._gang import GangCheckpoints
from tideflow.runtime.checkpoints import Checkpoints


@pytest.fixture
def gang_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """One worker's environment: a store keeping 2 checkpoints, one every 10 steps."""
    uri = (tmp_path / "ckpt").as_uri()
    monkeypatch.setenv("TIDEFLOW_CHECKPOINT_URI", uri)
    monkeypatch.setenv("TIDEFLOW_KEEP_LAST", "2")
    monkeypatch.setenv("TIDEFLOW_CHECKPOINT_EVERY_STEPS", "10")
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    # the runtime installs these for a worker process; this one is pytest's
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    yield uri
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def committed(uri: str) -> list[int]:
    return [manifest.step for manifest in CheckpointManager(uri).committed()]


def test_checkpoints_prune_the_preemption_checkpoint_they_resumed_from(gang_env: str) -> None:
    model = torch.nn.Linear(2, 1)
    first = Checkpoints({"model": model}, guard=None, exit_on_stop=False)
    assert first.restore() == 0
    for step in range(1, 26):
        first.watcher.requested = step == 25  # SIGTERM between steps 24 and 25
        first.save(step)
    assert first.exit_code == 75
    assert committed(gang_env) == [20, 25]  # step 25: the preemption's checkpoint

    second = Checkpoints({"model": model}, guard=None, exit_on_stop=False)
    assert second.restore() == 25
    for step in range(26, 51):
        second.save(step)
    second.finish(50)
    assert committed(gang_env) == [40, 50]


def test_framework_gangs_prune_the_preemption_checkpoint_they_resumed_from(
    gang_env: str, tmp_path: Path
) -> None:
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"weights")
    first = GangCheckpoints("hf")
    for step in (10, 20, 25):  # 25: committed on preemption, blocking, off the cadence
        first.commit(step, {"model.bin": weights}, block=True)
    assert committed(gang_env) == [20, 25]

    second = GangCheckpoints("hf")
    resumed = second.restore_into(tmp_path / "resume", lambda manifest: ["model.bin"])
    assert resumed is not None and resumed[0].step == 25
    for step in (30, 40, 50):
        second.commit(step, {"model.bin": weights}, block=True)
    second.finish()
    assert committed(gang_env) == [40, 50]


def test_a_preemption_checkpoint_that_is_the_best_is_kept(
    gang_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDEFLOW_KEEP_BEST_METRIC", "accuracy")
    model = torch.nn.Linear(2, 1)
    first = Checkpoints({"model": model}, guard=None, exit_on_stop=False)
    for step in range(1, 26):
        first.watcher.requested = step == 25
        first.save(step, metrics={"accuracy": 0.9 if step == 25 else 0.1})
    second = Checkpoints({"model": model}, guard=None, exit_on_stop=False)
    assert second.restore() == 25
    for step in range(26, 51):
        second.save(step, metrics={"accuracy": 0.5})
    second.finish(50)
    assert committed(gang_env) == [25, 40, 50]  # keep_best's, then the last 2
