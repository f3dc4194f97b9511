"""The simulator's queueing measured with the references (``research.broker.simulate``):
a gang the oracle stops waits again, and gangs stopped only to empty nodes wait again
too, so no policy's total wait is below its first wait."""

from __future__ import annotations

from pathlib import Path

import pytest

from research.broker.simulate import ResearchConfig, simulate
from tideflow.broker import SyntheticLoad, TraceLoad, synthetic_jobs

pytestmark = pytest.mark.research

DAYS = 4


@pytest.fixture(scope="module")
def diurnal() -> SyntheticLoad:
    # Night load about a third of the daytime peak, as in the users' clusters.
    return SyntheticLoad(mean_rps=2000, daily_amplitude=0.5, seed=11)


def test_total_queueing_counts_the_wait_after_a_preemption(tmp_path: Path) -> None:
    """One 8-GPU gang on 16 GPUs. The load needs the second node for windows 12-17 only:
    the oracle stops the gang at 2 h and gives the node back at 3 h, so the gang waited
    0 h before its first start and 1 h in all. A static split never stops it (the two
    are equal); a gang stopped and never restarted waits until the end."""
    from tideflow.broker.jobs import JobSpec

    trace = tmp_path / "step.csv"
    rates = [80.0] * 12 + [160.0] * 6 + [80.0] * 12
    trace.write_text(
        "start_s,rate_rps\n" + "".join(f"{i * 600},{r}\n" for i, r in enumerate(rates))
    )
    jobs = [JobSpec("a", 0.0, 8, 10 * 3600.0, 1800.0)]

    def metrics(policy: str) -> dict[str, float]:
        config = ResearchConfig(
            policy=policy, total_gpus=16, node_gpus=8, per_gpu_rps=10.0, headroom=0.0
        )
        return simulate(TraceLoad(trace), jobs, config).metrics

    oracle = metrics("oracle")
    assert oracle["preemptions"] == 1
    assert (oracle["mean_queueing_hours"], oracle["mean_total_queueing_hours"]) == (0.0, 1.0)
    static = metrics("static:8")
    assert (static["mean_queueing_hours"], static["mean_total_queueing_hours"]) == (0.0, 0.0)
    # Tidal, with no history, holds both nodes from the second window on: the gang,
    # stopped at 10 minutes, waits the remaining 29 windows.
    tidal = metrics("tidal")
    assert tidal["preemptions"] == 1
    assert tidal["mean_total_queueing_hours"] == round(29 * 600 / 3600, 2)


def test_every_wait_is_at_least_the_first_and_more_where_gangs_were_stopped(
    diurnal: SyntheticLoad,
) -> None:
    """Small gangs placed on nodes with victims chosen by count, so inference's growth
    also stops gangs only to empty nodes (the placement's own evictions): the stopped
    gangs wait again, and no policy's total wait is below its first wait."""
    jobs = synthetic_jobs(
        seed=2,
        total_gpus=200,
        horizon_s=DAYS * 86400,
        sizes=(1, 2, 4, 8, 16, 32),
        weights=(0.2, 0.2, 0.2, 0.2, 0.1, 0.1),
    )
    for policy in ("static:136", "tidal"):
        config = ResearchConfig(
            policy=policy, per_gpu_rps=25.0, placement="nodes", node_aware=False
        )
        m = simulate(diurnal, jobs, config, start_s=0, end_s=DAYS * 86400).metrics
        assert m["mean_total_queueing_hours"] >= m["mean_queueing_hours"]
        if policy == "tidal":
            assert m["placement_preemptions"] > 0
            assert m["mean_total_queueing_hours"] > m["mean_queueing_hours"]
        else:
            assert m["mean_total_queueing_hours"] == m["mean_queueing_hours"]
