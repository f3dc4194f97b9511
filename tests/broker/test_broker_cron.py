"""The cron day/night baseline: per hour of the day, the highest load at that hour over the
past week, re-learned at midnight, plus a fixed headroom; and the load shapes laid over a
trace for benchmarks (weekly, holiday, step, drift)."""

from __future__ import annotations

import pytest

from tideflow.broker import SimulationConfig, SyntheticLoad, simulate, synthetic_jobs
from tideflow.broker.cron import CronSchedule
from tideflow.broker.load import LoadSample

DAY, HOUR = 86400.0, 3600.0


def history(rate_of: dict[tuple[int, int], float], days: int) -> list[LoadSample]:
    """Ten-minute windows over ``days`` days at 100 rps, except (day, hour) -> rate."""
    return [
        LoadSample(t, rate_of.get((int(t // DAY), int(t % DAY // HOUR)), 100.0))
        for t in (600.0 * i for i in range(days * 144))
    ]


def test_each_hour_gets_its_highest_load_of_the_past_week_plus_headroom() -> None:
    past = history({(1, 3): 400.0, (6, 3): 300.0, (0, 3): 900.0, (8, 3): 700.0}, days=9)
    cron = CronSchedule(headroom=0.2)
    at_3am_day_8 = 8 * DAY + 3 * HOUR
    # day 0 is more than 7 days before day 8's midnight; today's 700 is not learned yet
    seen = [s for s in past if s.start_s < at_3am_day_8]
    assert cron.forecast(seen, at_3am_day_8, 600).upper == pytest.approx(400.0 * 1.2)
    assert cron.forecast(seen, 8 * DAY + 5 * HOUR, 600).upper == pytest.approx(120.0)
    # re-learned at the next midnight: today's 700 at 3 am now counts
    assert cron.forecast(past, 9 * DAY + 3 * HOUR, 600).upper == pytest.approx(700.0 * 1.2)


def test_a_horizon_crossing_the_hour_takes_the_next_hours_schedule_too() -> None:
    past = history({(1, 4): 500.0}, days=3)
    cron = CronSchedule()
    now = 2 * DAY + 3 * HOUR + 3000  # 03:50
    assert cron.forecast(past, now, 300).upper == pytest.approx(100.0)
    assert cron.forecast(past, now, 1200).upper == pytest.approx(500.0)


def test_before_a_full_day_it_holds_the_highest_load_seen() -> None:
    past = [LoadSample(0.0, 100.0), LoadSample(600.0, 250.0), LoadSample(1200.0, None)]
    assert CronSchedule().forecast(past, 1800.0, 600).upper == pytest.approx(250.0)
    assert CronSchedule().forecast([], 0.0, 600).upper is None


def test_cron_policy_follows_the_day_night_cycle_in_the_simulator() -> None:
    load = SyntheticLoad(mean_rps=2000, daily_amplitude=0.5, seed=3, burst_probability=0.0)
    jobs = synthetic_jobs(seed=2, total_gpus=200, horizon_s=3 * DAY)
    result = simulate(
        load, jobs, SimulationConfig(policy="cron:0.2", per_gpu_rps=25), start_s=0, end_s=3 * DAY
    )
    day3 = [w for w in result.windows if w.start_s >= 2 * DAY]
    night = min(w.inference_gpus for w in day3 if 1 <= w.start_s % DAY / HOUR < 4)
    peak = max(w.inference_gpus for w in day3 if 12 <= w.start_s % DAY / HOUR < 16)
    assert night <= 0.5 * peak
    assert result.metrics["slo_attainment"] > 0.99


def test_cron_policy_names_its_headroom() -> None:
    with pytest.raises(ValueError, match=r"cron:0\.2"):
        SimulationConfig(policy="cron:lots").static_gpus()
    assert SimulationConfig(policy="cron:0.3").cron_headroom() == pytest.approx(0.3)
