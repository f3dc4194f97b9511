"""The digits gang on a real CUDA GPU: bf16 autocast, checkpoint and bitwise resume.

Skipped where no CUDA device is present (CI has none). One GPU allows a
one-worker gang only: NCCL refuses two ranks on the same device, so the
multi-rank NCCL path needs a machine with two or more GPUs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.checkpoints.test_runtime_distributed import (
    assert_same,
    final_weights,
    job,
    splits,
    wait_for_step,
)
from tideflow.backends import GangState
from tideflow.backends.local import LocalBackend
from tideflow.checkpoint import CheckpointManager

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

__all__ = ["splits"]  # the module-scoped fixture, shared with the CPU tests


def test_gpu_gang_trains_in_bf16_and_resumes_bitwise_equal(
    splits: dict[str, str], tmp_path: Path
) -> None:
    backend = LocalBackend(tmp_path / "gangs")
    reference = (tmp_path / "reference").as_uri()
    backend.submit(job("gpu-ref", splits, reference, device_class="gpu", workers=1))
    status = backend.wait("gpu-ref", 300)
    log = backend.log_path("gpu-ref").read_text()
    assert status.state is GangState.SUCCEEDED, log[-3000:]
    assert "device cuda:0, precision bfloat16" in log, log[:2000]
    accuracy = float(re.findall(r'"val_accuracy": ([0-9.]+)', log)[-1])
    assert accuracy >= 0.93, log[-2000:]
    assert status.device_seconds > 0

    resumed = (tmp_path / "resumed").as_uri()
    backend.submit(job("gpu-pre", splits, resumed, device_class="gpu", workers=1, step_delay=0.02))
    wait_for_step(backend.log_path("gpu-pre"), 45)
    backend.preempt("gpu-pre")
    assert backend.wait("gpu-pre", 120).state is GangState.PREEMPTED
    stopped = CheckpointManager(resumed).latest()
    assert stopped is not None
    backend.submit(job("gpu-pre", splits, resumed, device_class="gpu", workers=1))
    assert backend.wait("gpu-pre", 300).state is GangState.SUCCEEDED
    assert f"resumed from step {stopped.step}" in backend.log_path("gpu-pre").read_text()
    reference_step, reference_weights = final_weights(reference)
    step, weights = final_weights(resumed)
    assert step == reference_step
    assert all(t.device.type == "cpu" for t in weights.values())  # checkpoints load anywhere
    assert_same(weights, reference_weights)
