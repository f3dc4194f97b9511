"""The forecast's upper bound calibrated online to the inference SLO (simulator, service)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from tideflow.broker.calibrate import SloCalibration, scaled
from tideflow.broker.forecast import Forecast
from tideflow.broker.journal import DecisionJournal
from tideflow.broker.policy import Action, BrokerDecision
from tideflow.broker.service import coverage


def test_a_miss_raises_the_margin_and_hits_lower_it_within_bounds() -> None:
    calibration = SloCalibration(target=0.995, step=0.05)
    assert calibration.next(0.0, covered=False) == pytest.approx(0.05 * 0.995)
    assert calibration.next(0.0, covered=True) == pytest.approx(-0.05 * 0.005)
    assert calibration.replay([False] * 50) == 0.5  # capped: at most 1.65x the bound
    assert calibration.replay([True] * 100_000) == -0.5
    forecast = Forecast(100.0, 120.0, 150.0, "level")
    assert scaled(forecast, 0.0) is forecast
    assert scaled(forecast, math.log(1.2)).upper == pytest.approx(180.0)
    assert scaled(forecast, math.log(1.2)).peak == 120.0  # only the bound moves


def test_misses_settle_at_the_slo_whatever_bound_delivers_it() -> None:
    """A stand-in world where load over a window is lognormal around the forecast and the
    bound covers it when exp(margin) beats it: an uncalibrated bound (margin 0) misses half
    the windows; calibration finds the margin that misses 0.5%, unknown in advance."""
    calibration = SloCalibration(target=0.995, step=0.05)
    rng = random.Random(7)
    margin, misses, windows = 0.0, 0, 40_000
    for _ in range(windows):
        covered = rng.lognormvariate(0.0, 0.1) <= math.exp(margin)
        misses += not covered
        margin = calibration.next(margin, covered)
    assert misses / windows == pytest.approx(0.005, abs=0.001)
    assert 0.2 < margin < 0.35  # about the 99.5th percentile of the noise: 0.1 * 2.58


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="SLO target"):
        SloCalibration(target=99.5)
    with pytest.raises(ValueError, match="low <= 0 <= high"):
        SloCalibration(low=0.1)


def decision(inference: int, needed: int | None) -> BrokerDecision:
    return BrokerDecision(Action.HOLD, inference, needed, None, reason="test")


def test_service_reads_one_outcome_per_load_window_from_the_journal(tmp_path: Path) -> None:
    journal = DecisionJournal(tmp_path / "broker.db")
    # (time, GPUs held after the decision, need measured over the window before it)
    for at_s, held, needed in [
        (0, 40, None),
        (600, 40, 36),  # window 1: covered by the 40 held
        (1300, 48, 38),  # window 2, superseded by the next decision in it
        (1500, 48, 52),  # window 2: 48 held, 52 needed: a miss
        (1900, 56, None),  # window 3: a data gap, no outcome
        (2400, 56, 50),  # window 4: covered
    ]:
        journal.record(
            at_s, decision(held, needed), total_gpus=200, measured_rps=None, forecast_upper=None
        )
    assert coverage(journal.since(0), 600.0) == [True, False, True]


def test_misses_never_exceed_the_promise_while_the_margin_is_under_its_ceiling() -> None:
    calibration = SloCalibration(target=0.995)
    rng = random.Random(5)
    for trial in range(200):
        miss_rate = rng.choice((0.0, 0.005, 0.01, 0.03, 0.2))
        margin, misses, saturated = 0.0, 0, False
        outcomes = [rng.random() >= miss_rate for _ in range(rng.randrange(50, 3000))]
        if trial % 2:  # adversarial: all misses at the start, where the margin is lowest
            outcomes.sort()
        for covered in outcomes:
            saturated |= calibration.saturated(margin, covered)
            misses += not covered
            margin = calibration.next(margin, covered)
        if not saturated:
            assert misses <= calibration.promised_misses(len(outcomes)) + 1e-9
    # 2016 windows (14 days of 10 minutes): 10 + 10.08 misses promised, i.e. >= 99.0%
    assert calibration.promised_misses(2016) == pytest.approx(20.08)


def test_a_miss_at_the_ceiling_voids_the_promise() -> None:
    calibration = SloCalibration(target=0.995, high=0.5)
    assert not calibration.saturated(0.2, covered=False)
    assert calibration.saturated(0.49, covered=False)
    assert not calibration.saturated(0.5, covered=True)


def test_the_simulator_reports_the_promise_and_keeps_it() -> None:
    from tideflow.broker import SimulationConfig, SyntheticLoad, simulate, synthetic_jobs

    jobs = synthetic_jobs(seed=2, total_gpus=200, horizon_s=3 * 86400)
    metrics = simulate(
        SyntheticLoad(mean_rps=2000, seed=4),
        jobs,
        SimulationConfig(policy="tidal", per_gpu_rps=25.0),
        start_s=0,
        end_s=3 * 86400,
    ).metrics
    scored = metrics["windows"] - metrics["gap_windows"]
    assert metrics["slo_promised"] == pytest.approx(1 - (0.005 * scored + 10) / scored, abs=1e-4)
    assert metrics["calibration_saturated_windows"] == 0
    assert metrics["slo_attainment"] >= metrics["slo_promised"]


def test_lost_work_under_budget_lends_more_and_over_budget_the_bound_is_the_fixed_one() -> None:
    from tideflow.broker.calibrate import LostWorkBudget

    budget = LostWorkBudget.for_cluster(0.01, total_gpus=200)
    day = 200 * 86400.0  # a day of the whole cluster, GPU-seconds
    assert budget.margin(0.0, 0.0) == 0.0  # nothing done, nothing lost: the fixed bound
    # a tenth of a day of training with nothing lost: the bound shrinks (more is lent) ...
    assert budget.margin(0.0, 0.1 * day) == pytest.approx(-0.1)
    assert budget.margin(0.0, 10 * day) == -0.25  # ... down to its floor
    # over budget: the fixed bound, and the window is counted as over budget
    assert budget.margin(0.01 * day, 0.5 * day) == 0.0
    assert budget.saturated(0.01 * day, 0.5 * day) and not budget.saturated(0.0, day)
    assert budget.lends_beyond_the_bound_under(day) == pytest.approx(0.01 * day)
    # a brake (high > 0) holds more than the fixed bound over budget
    brake = LostWorkBudget.for_cluster(0.01, total_gpus=200, high=0.5)
    assert 0 < brake.margin(0.001 * day, 0.05 * day) < 0.5
    assert brake.margin(0.1 * day, day) == 0.5
    with pytest.raises(ValueError, match="0 < budget < 1"):
        LostWorkBudget(0.0, 1.0)
    with pytest.raises(ValueError, match="low <= 0 <= high"):
        LostWorkBudget(0.01, 1.0, high=-0.1)


def test_the_simulator_lends_more_under_the_lost_work_budget_and_reports_it() -> None:
    """The same load and gangs with the lend bound fixed, with a budget never reached
    (20%: it lends more and preempts more) and with one spent at once (0.01%: the fixed
    bound's decisions, every window after the first loss counted as over budget)."""
    from tideflow.broker import SimulationConfig, SyntheticLoad, simulate, synthetic_jobs

    load = SyntheticLoad(mean_rps=2000, seed=4)
    jobs = synthetic_jobs(seed=2, total_gpus=200, horizon_s=4 * 86400)
    runs = {}
    for budget in (None, 0.0001, 0.2):
        config = SimulationConfig(policy="tidal", per_gpu_rps=25.0, lost_work_budget=budget)
        runs[budget] = simulate(load, jobs, config, start_s=0, end_s=4 * 86400).metrics
    fixed, spent, loose = runs[None], runs[0.0001], runs[0.2]
    assert "lost_work_budget_gpu_hours" not in fixed
    assert loose["mean_inference_gpus"] < fixed["mean_inference_gpus"]
    assert loose["preemptions"] > fixed["preemptions"]
    assert loose["lost_work_over_budget_windows"] == 0
    assert loose["lost_gpu_hours"] <= loose["lost_work_budget_gpu_hours"]
    assert spent["lost_gpu_hours"] > spent["lost_work_budget_gpu_hours"]
    assert spent["lost_work_over_budget_windows"] > 0.5 * spent["windows"]
    assert abs(spent["mean_inference_gpus"] - fixed["mean_inference_gpus"]) < 2
