"""The burst-blind bound (``policy="oracle-burst-blind"``): what a policy that knew each
window's load but for its burst could reach, on a load that says where its bursts are
(the synthetic diurnal load; ``bench/broker.py`` reports it next to tidal).

Pure simulation on the seeded synthetic load: no server is involved.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from research.broker.bounds import burst_blind_plan
from research.broker.simulate import ResearchConfig, simulate
from tideflow.broker import SyntheticLoad, TraceLoad, synthetic_jobs

pytestmark = pytest.mark.research

DAY = 86400.0
LOAD = SyntheticLoad(mean_rps=2000, daily_amplitude=0.5, seed=11)


def test_the_load_names_its_burst_windows_and_their_rate_is_the_burst_factor_times() -> None:
    """Every window bursting against none: the same draws otherwise, so each rate is the
    burst factor times the calm one, and each window is named a burst."""
    always = SyntheticLoad(mean_rps=2000, seed=11, burst_probability=1.0)
    never = SyntheticLoad(mean_rps=2000, seed=11, burst_probability=0.0)
    compared = 0
    for start in range(0, int(DAY), 600):
        calm, burst = never.rate_at(start), always.rate_at(start)
        if calm is None:  # an outage in both
            assert burst is None
            continue
        assert burst == pytest.approx(1.6 * calm)
        assert always.burst_at(start) and not never.burst_at(start)
        compared += 1
    assert compared > 130
    bursts = [t for t in range(0, int(14 * DAY), 600) if LOAD.burst_at(t)]
    assert 0.005 < len(bursts) / (14 * 144) < 0.02  # about 1% of windows


def test_the_plan_insures_the_windows_of_least_load_and_only_them() -> None:
    samples = LOAD.samples(0, 2 * DAY)
    base, none_insured = burst_blind_plan(LOAD, samples, 0.0)
    assert none_insured == base
    for sample, calm in zip(samples, base, strict=True):
        if sample.rate is not None:
            assert calm is not None
            expected = sample.rate / 1.6 if LOAD.burst_at(sample.start_s) else sample.rate
            assert calm == pytest.approx(expected)
    _, half = burst_blind_plan(LOAD, samples, 0.5)
    insured = [c for c, p in zip(base, half, strict=True) if c is not None and p != c]
    left = [c for c, p in zip(base, half, strict=True) if c is not None and p == c]
    assert abs(len(insured) - len(left)) <= 1
    assert max(insured) < min(left)  # the cheapest windows hold the room
    assert all(p == pytest.approx(1.6 * c) for c, p in zip(base, half, strict=True) if c and p != c)
    _, everything = burst_blind_plan(LOAD, samples, 1.0)
    assert all(p == pytest.approx(1.6 * c) for c, p in zip(base, everything, strict=True) if c)


def test_insuring_more_windows_buys_slo_with_training_goodput() -> None:
    """Nothing insured, the bound misses about the burst windows; everything insured,
    it covers nearly all; the SLO rises and training's goodput falls in between."""
    jobs = synthetic_jobs(seed=2, total_gpus=200, horizon_s=4 * DAY)
    runs = {
        share: simulate(
            LOAD,
            jobs,
            ResearchConfig(policy="oracle-burst-blind", per_gpu_rps=25.0, insured_share=share),
            start_s=0,
            end_s=4 * DAY,
        ).metrics
        for share in (0.0, 0.5, 1.0)
    }
    slo = [runs[s]["slo_attainment"] for s in (0.0, 0.5, 1.0)]
    goodput = [runs[s]["training_goodput_gpu_hours"] for s in (0.0, 0.5, 1.0)]
    assert slo[0] < slo[1] < slo[2] and slo[2] >= 0.998
    assert goodput[0] > goodput[1] > goodput[2]
    scored = runs[0.0]["windows"] - runs[0.0]["gap_windows"]
    bursts = sum(LOAD.burst_at(t) for t in range(0, int(4 * DAY), 600))
    assert round((1 - slo[0]) * scored) <= bursts + 1  # it misses bursts, little else


def test_a_load_that_does_not_say_where_it_bursts_is_refused(tmp_path: Path) -> None:
    trace = tmp_path / "load.csv"
    trace.write_text("start_s,rate_rps\n" + "".join(f"{i * 600},{100 + i}\n" for i in range(20)))
    with pytest.raises(ValueError, match="needs a load that says which windows burst"):
        simulate(
            TraceLoad(trace),
            [],
            ResearchConfig(policy="oracle-burst-blind", per_gpu_rps=25.0),
        )
    with pytest.raises(ValueError, match=r"insured_share must be within \[0, 1\]"):
        burst_blind_plan(LOAD, LOAD.samples(0, DAY), 1.5)


def test_the_bound_runs_on_the_synthetic_load_and_refuses_a_trace(tmp_path: Path) -> None:
    config = ResearchConfig(policy="oracle-burst-blind", per_gpu_rps=25.0)
    jobs = synthetic_jobs(seed=0, total_gpus=200, horizon_s=2 * DAY)
    result = simulate(LOAD, jobs, config, start_s=0, end_s=2 * DAY)
    assert result.metrics["slo_attainment"] is not None
    trace = tmp_path / "load.csv"
    trace.write_text("start_s,rate_rps\n" + "".join(f"{i * 600},{100 + i}\n" for i in range(20)))
    with pytest.raises(ValueError, match="needs a load that says which windows burst"):
        simulate(TraceLoad(trace), jobs, config)


def test_an_unknown_policy_names_every_policy_and_bound() -> None:
    with pytest.raises(ValueError) as caught:
        ResearchConfig(policy="magic").static_gpus()
    message = str(caught.value)
    for name in ("'tidal'", "'static:N'", "'cron:H'", "'oracle'", "'oracle-burst-blind'"):
        assert name in message
    assert "e.g. cron:0.2), 'oracle'" in message  # one list, each entry set off


def test_a_room_below_the_burst_is_held_in_every_insured_window_on_the_calm_load() -> None:
    """``room`` changes what is held, not what is known: the calm load is still the rate
    without its whole burst."""
    samples = LOAD.samples(0, 2 * DAY)
    base, full = burst_blind_plan(LOAD, samples, 1.0)
    same_base, lean = burst_blind_plan(LOAD, samples, 1.0, room=1.3)
    assert same_base == base
    assert all(p == pytest.approx(1.3 * c) for c, p in zip(base, lean, strict=True) if c)
    assert all(p is None for c, p in zip(base, lean, strict=True) if c is None)
    assert full != lean
    with pytest.raises(ValueError, match="burst_room must be at least 1"):
        burst_blind_plan(LOAD, samples, 1.0, room=0.9)
    with pytest.raises(ValueError, match="burst_room must be at least 1"):
        ResearchConfig(policy="oracle-burst-blind", burst_room=0.5)


def test_more_room_in_every_window_covers_every_window_less_room_covered() -> None:
    """The benchmark bisects on the room for the smallest that reaches an SLO, which is
    sound only if coverage never falls as the room grows: each window covered at a
    smaller room is covered at every larger one, with as many inference GPUs or more."""
    jobs = synthetic_jobs(seed=2, total_gpus=200, horizon_s=4 * DAY)
    held = {}
    for room in (1.0, 1.2, 1.4, 1.6):
        config = ResearchConfig(
            policy="oracle-burst-blind", per_gpu_rps=25.0, insured_share=1.0, burst_room=room
        )
        held[room] = simulate(LOAD, jobs, config, start_s=0, end_s=4 * DAY).windows
    rooms = sorted(held)
    for smaller, larger in itertools.pairwise(rooms):
        for before, after in zip(held[smaller], held[larger], strict=True):
            assert after.inference_gpus >= before.inference_gpus
            if before.needed is not None and before.inference_gpus >= before.needed:
                assert after.inference_gpus >= after.needed  # type: ignore[operator]
    missed = [
        sum(w.needed is not None and w.inference_gpus < w.needed for w in held[r]) for r in rooms
    ]
    assert missed[0] > missed[-1]  # and the room does buy coverage
