"""Elastic gangs in the simulator measured with the oracle (``research.broker``): a
shrunk gang keeps running at a speed in proportion to its GPUs (restart-based, as on
the local backend) where a rigid one is stopped."""

from __future__ import annotations

import pytest

from research.broker.simulate import ResearchConfig, simulate
from tideflow.broker import JobSpec, LoadSample

pytestmark = pytest.mark.research


class _StepLoad:
    """Six hours at 1000 rps, then a jump to 2000 rps: inference must take 40 GPUs back."""

    window_s = 600.0
    start_s = 0.0
    end_s = 12 * 3600.0

    def samples(self, start_s: float, end_s: float) -> list[LoadSample]:
        return [
            LoadSample(t, 1000.0 if t < 6 * 3600 else 2000.0)
            for t in (600.0 * i for i in range(int(start_s // 600), int(end_s // 600)))
        ]


def run(elastic: bool) -> dict[str, float]:
    jobs = [JobSpec(f"g{i}", 0.0, 64, 10 * 3600.0, 1800.0, 0, 32) for i in range(2)]
    config = ResearchConfig(policy="oracle", per_gpu_rps=25.0, elastic=elastic)
    return simulate(_StepLoad(), jobs, config).metrics


def test_simulated_elastic_gangs_shrink_and_keep_running_where_rigid_ones_stop() -> None:
    elastic, rigid = run(True), run(False)
    assert elastic["shrinks"] >= 1 and elastic["preemptions"] == 0
    assert rigid["preemptions"] >= 1 and rigid["shrinks"] == 0
    assert elastic["training_goodput_gpu_hours"] > rigid["training_goodput_gpu_hours"]


class _TwoLevels:
    """176 GPUs of load for an hour, then 184: a 24-GPU gang must give 8 back."""

    window_s = 600.0
    start_s = 0.0
    end_s = 6 * 3600.0

    def samples(self, start_s: float, end_s: float) -> list[LoadSample]:
        return [
            LoadSample(t, 4400.0 if t < 3600 else 4600.0)
            for t in (600.0 * i for i in range(int(start_s // 600), int(end_s // 600)))
        ]


def test_a_shrunk_gang_runs_on_at_the_speed_of_the_gpus_it_keeps() -> None:
    job = JobSpec("elastic", 0.0, 24, 2 * 3600.0, 600.0, 0, 8)
    config = ResearchConfig(policy="oracle", per_gpu_rps=25.0, headroom=0.0)
    result = simulate(_TwoLevels(), [job], config)
    assert result.metrics["shrinks"] == 1 and result.metrics["preemptions"] == 0
    # 3300 s of work in the first hour (after its 300 s start-up), a checkpoint on notice,
    # a 300 s restart on 16 GPUs, then the other 3900 s of work at 16/24 of full speed
    assert result.metrics["mean_jct_hours"] == pytest.approx(
        (3600 + 300 + 3900 * 24 / 16) / 3600, abs=0.01
    )
