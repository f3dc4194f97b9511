"""Two real gloo workers training the digits MLP through the local gang backend.

Checks the promises of the runtime end to end: a gang with a worker killed by
SIGKILL and then preempted (SIGTERM) resumes each time from its newest committed
checkpoint and ends with weights bitwise equal to an uninterrupted run.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import made_once
from tideflow.backends import GangJob, GangState, WorkerSlot
from tideflow.backends.local import LocalBackend
from tideflow.checkpoint import CheckpointManager
from tideflow.examples.digits import prepare
from tideflow.steps import StepContext

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def splits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The digits splits, prepared once for the run's test workers."""
    with made_once(tmp_path_factory, "digits-splits") as (root, fresh):
        if fresh:
            ctx = StepContext(
                pipeline="digits",
                team="t",
                step="prep",
                dag_id="digits",
                run_id="r",
                try_number=1,
                artifact_root=root.as_uri(),
            )
            (root / "splits.json").write_text(json.dumps(prepare(ctx)))
        return dict(json.loads((root / "splits.json").read_text()))


def job(
    gang_id: str,
    splits: dict[str, str],
    checkpoints: str,
    *,
    max_restarts: int = 0,
    step_delay: float = 0.0,
    device_class: str = "cpu",
    workers: int = 2,
) -> GangJob:
    command = (
        sys.executable,
        "-m",
        "tideflow.examples.digits_train",
        "--train",
        splits["train"],
        "--validation",
        splits["validation"],
        "--epochs",
        "6",
        "--checkpoint-every",
        "10",
        "--step-delay",
        str(step_delay),
    )
    return GangJob(
        gang_id,
        command,
        {"TIDEFLOW_CHECKPOINT_URI": checkpoints},
        tuple(WorkerSlot(rank, "localhost", (rank,)) for rank in range(workers)),
        device_class,
        False,
        max_restarts,
    )


def final_weights(checkpoints: str) -> tuple[int, dict[str, torch.Tensor]]:
    manager = CheckpointManager(checkpoints)
    manifest = manager.latest()
    assert manifest is not None
    state = torch.load(io.BytesIO(manager.read_shard(manifest, "model.pt")), weights_only=True)
    return manifest.step, state["model"]


def wait_for_step(log: Path, step: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and f"step {step} loss" in log.read_text():
            return
        time.sleep(0.05)
    raise TimeoutError(f"step {step} not reached; log:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def reference(
    splits: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> tuple[int, dict[str, torch.Tensor]]:
    """The uninterrupted run the interrupted ones must equal bitwise: the same command
    on the same splits, so run once for the run's test workers (the broker and teams
    modules compare against it too)."""
    with made_once(tmp_path_factory, "digits-reference") as (root, fresh):
        checkpoints = (root / "ckpt").as_uri()
        if fresh:
            backend = LocalBackend(root / "gangs")
            backend.submit(job("reference", splits, checkpoints))
            status = backend.wait("reference", 300)
            log = backend.log_path("reference").read_text()
            assert status.state is GangState.SUCCEEDED, log[-3000:]
            accuracy = float(re.findall(r'"val_accuracy": ([0-9.]+)', log)[-1])
            assert accuracy >= 0.93, log[-2000:]  # 6 epochs; the pipeline's 10 reach >= 0.95
        return final_weights(checkpoints)


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key, tensor in a.items():
        assert torch.equal(tensor, b[key]), f"{key} differs"


def test_a_killed_worker_and_a_later_preemption_each_resume_bitwise_equal(
    splits: dict[str, str], reference: tuple[int, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    """Rank 1 killed (SIGKILL): the supervisor restarts the gang from its newest
    checkpoint. The restarted gang, preempted (SIGTERM), checkpoints the step it stopped
    at and exits 75; submitted again when capacity is back, it resumes there."""
    backend = LocalBackend(tmp_path / "gangs")
    checkpoints = (tmp_path / "ckpt").as_uri()
    backend.submit(job("story", splits, checkpoints, max_restarts=1, step_delay=0.05))
    log = backend.log_path("story")
    wait_for_step(log, 35)
    pid = int(re.search(r"rank 1: pid (\d+)", log.read_text()).group(1))  # type: ignore[union-attr]
    os.kill(pid, signal.SIGKILL)
    wait_for_step(log, 75)  # past where the first attempt died: the restarted gang trains
    backend.preempt("story")
    status = backend.wait("story", 120)
    text = log.read_text()
    assert status.state is GangState.PREEMPTED and status.restarts == 1, text[-3000:]
    assert status.exit_codes == (75, 75), text[-3000:]
    assert "rank 1 died (signal 9)" in text
    assert re.search(r"resumed from step (\d+) \(restart 1\)", text)
    stopped = CheckpointManager(checkpoints).latest()
    assert stopped is not None and 75 <= stopped.step < reference[0]
    backend.submit(job("story", splits, checkpoints))  # capacity is back: resume
    assert backend.wait("story", 300).state is GangState.SUCCEEDED
    assert f"resumed from step {stopped.step} (restart 0)" in log.read_text()
    step, weights = final_weights(checkpoints)
    assert step == reference[0]
    assert_same(weights, reference[1])


def test_exploding_learning_rate_stops_with_the_last_good_checkpoint_marked(
    splits: dict[str, str], tmp_path: Path
) -> None:
    import subprocess

    checkpoints = (tmp_path / "ckpt").as_uri()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tideflow.examples.digits_train",
            "--train",
            splits["train"],
            "--validation",
            splits["validation"],
            "--lr",
            "50",
            "--checkpoint-every",
            "5",
        ],
        env={**os.environ, "TIDEFLOW_CHECKPOINT_URI": checkpoints},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 76, done.stdout[-2000:] + done.stderr[-2000:]
    message = re.search(r"training-health guard stopped the run: (.*)", done.stdout)
    assert message is not None, done.stdout[-2000:]
    stopped_at = int(re.search(r"at step (\d+)", message.group(1)).group(1))  # type: ignore[union-attr]
    assert stopped_at <= 5  # the loss takes off at once with lr=50; caught within steps
    assert "loss exploded" in message.group(1)
    last_good = CheckpointManager(checkpoints).marked("last-good")
    assert last_good is None or last_good < stopped_at  # never a checkpoint from after it
