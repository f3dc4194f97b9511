"""Replay a load trace in simulated time against a backlog of training gangs.

What a user runs before turning the broker on: their own trace (or a seeded
synthetic one) and training backlog, under the broker's policy ("tidal"), a
static split ("static:N") or a cron day/night schedule ("cron:H"). Per window
(the trace's, e.g. 600 s): the policy sees only the samples before the window
and decides the inference allocation; the backlog (``tideflow.broker.backlog``)
stops, shrinks, starts and advances its gangs; afterwards each window is scored
against the load it really had.

Simplifications, the same for every policy: GPUs are counted, not placed (the
policy moves whole nodes and gangs are whole nodes, so counting is placing);
inference capacity moves at the start of a window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

from tideflow.broker.backlog import Backlog, CountedGpus, Placement
from tideflow.broker.calibrate import LostWorkBudget, SloCalibration, scaled
from tideflow.broker.cron import CronSchedule
from tideflow.broker.forecast import HISTORY_S, LoadForecaster, clean_outages
from tideflow.broker.jobs import JobSpec
from tideflow.broker.load import LoadSample, LoadSource
from tideflow.broker.policy import Action, decide
from tideflow.broker.simulation import Plan, SimulationConfig, SimulationResult, Window


class Planner(Protocol):
    """Where a simulated policy's forecasts come from, window by window."""

    def plan(
        self, index: int, samples: Sequence[LoadSample], windows: Sequence[Window], backlog: Backlog
    ) -> Plan: ...

    def metrics(self, scored_windows: int, trained_gpu_s: float) -> dict[str, Any]: ...


class TidalPlanner:
    """The running broker's forecasts: history only, the upper bound calibrated to the
    SLO, the lend bound scaled by the lost-work budget (each when configured)."""

    def __init__(
        self, config: SimulationConfig, step: float, *, calibrated: bool, budgeted: bool
    ) -> None:
        self.policy = config.policy_config()
        self.step = step
        self.forecaster = LoadForecaster(step, quantile=config.forecast_quantile)
        self.calibration = (
            SloCalibration(config.slo_target, step=config.slo_step)
            if (calibrated and config.slo_target is not None)
            else None
        )
        self.margin = 0.0
        self.saturated = 0  # windows whose miss the margin could not answer (at its ceiling)
        self.budget = (
            LostWorkBudget.for_cluster(
                config.lost_work_budget,
                config.total_gpus,
                low=config.lost_work_low,
                high=config.lost_work_high,
            )
            if (budgeted and config.lost_work_budget is not None)
            else None
        )
        self.budget_saturated = 0  # windows over the budget (lending at the fixed bound)
        self.budget_windows: int | None = (
            None
            if config.lost_work_window_s is None
            else max(1, round(config.lost_work_window_s / step))
        )

    def plan(
        self, index: int, samples: Sequence[LoadSample], windows: Sequence[Window], backlog: Backlog
    ) -> Plan:
        now, policy = samples[index].start_s, self.policy
        history = samples[max(0, index - int(HISTORY_S / self.step)) : index]
        measured = windows[-1] if windows else None
        if self.calibration is not None and measured is not None and measured.needed is not None:
            # The last window's outcome is known now (its load has been measured).
            covered = measured.inference_gpus >= measured.needed
            self.saturated += self.calibration.saturated(self.margin, covered)
            self.margin = self.calibration.next(self.margin, covered)
        forecast = scaled(self.forecaster.forecast(history, now, policy.lead_s), self.margin)
        lend_forecast = self.forecaster.forecast(
            history, now, policy.lend_horizon_s, policy.lend_quantile
        )
        if self.budget is not None:  # the work lost and done so far is known now
            span = self.budget_windows or len(samples)
            trained = sum(backlog.busy[-span:])
            lost = sum(backlog.lost_by_window[-span:])
            self.budget_saturated += self.budget.saturated(lost, trained)
            lend_forecast = scaled(lend_forecast, self.budget.margin(lost, trained))
        return Plan(forecast, lend_forecast, samples[index - 1].rate if index else None)

    def metrics(self, scored_windows: int, trained_gpu_s: float) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.calibration is not None:
            misses = self.calibration.promised_misses(scored_windows)
            promised = max(0.0, 1 - misses / max(1, scored_windows))
            out["slo_promised"] = round(promised, 5)  # void if any window was saturated
            out["calibration_saturated_windows"] = self.saturated
        if self.budget is not None:
            out["lost_work_budget_gpu_hours"] = round(
                self.budget.lends_beyond_the_bound_under(trained_gpu_s) / 3600, 1
            )
            out["lost_work_over_budget_windows"] = self.budget_saturated
        return out


class CronPlanner:
    """A cron day/night schedule: its own schedule is no forecast, so it may look past
    the lead at what it will ask for over the lend horizon."""

    def __init__(self, config: SimulationConfig, step: float, headroom: float) -> None:
        self.policy = config.policy_config()
        self.step = step
        self.cron = CronSchedule(headroom=headroom)

    def plan(
        self, index: int, samples: Sequence[LoadSample], windows: Sequence[Window], backlog: Backlog
    ) -> Plan:
        now = samples[index].start_s
        history = samples[max(0, index - int(HISTORY_S / self.step)) : index]
        return Plan(
            self.cron.forecast(history, now, self.policy.lead_s),
            self.cron.forecast(history, now, self.policy.lend_horizon_s),
            samples[index - 1].rate if index else None,
        )

    def metrics(self, scored_windows: int, trained_gpu_s: float) -> dict[str, Any]:
        return {}  # a cron's headroom is fixed: no promise to print


def planner_for(config: SimulationConfig, step: float) -> Planner | None:
    """The planner of the configured policy (None: a static split, nothing to plan)."""
    if config.static_gpus() is not None:
        return None
    headroom = config.cron_headroom()
    if headroom is not None:
        return CronPlanner(config, step, headroom)
    return TidalPlanner(config, step, calibrated=True, budgeted=True)


def trace_samples(
    load: LoadSource, start_s: float | None = None, end_s: float | None = None
) -> tuple[list[LoadSample], float]:
    """The load's windows over [start_s, end_s) (a trace's own bounds by default), and
    where they end."""
    start = start_s if start_s is not None else getattr(load, "start_s", None)
    end = end_s if end_s is not None else getattr(load, "end_s", None)
    if start is None or end is None or end <= start:
        raise ValueError(
            "simulate: give start_s < end_s for a load without its own bounds "
            f"(got {start!r}, {end!r})"
        )
    return load.samples(start, end), end


def simulate(
    load: LoadSource,
    jobs: list[JobSpec],
    config: SimulationConfig,
    *,
    start_s: float | None = None,
    end_s: float | None = None,
) -> SimulationResult:
    """Replay ``load`` over [start_s, end_s); a trace's own bounds are the default."""
    config.static_gpus()  # an unknown policy is refused before any work
    raw, end = trace_samples(load, start_s, end_s)
    # What the broker sees: outage windows become gaps (judged on the past only).
    samples = clean_outages(raw)
    planner = planner_for(config, load.window_s)
    return replay(samples, jobs, config, planner, window_s=load.window_s, end_s=end)


def replay(
    samples: Sequence[LoadSample],
    jobs: list[JobSpec],
    config: SimulationConfig,
    planner: Planner | None,
    *,
    window_s: float,
    end_s: float,
    placement: Placement | None = None,
) -> SimulationResult:
    """The simulation's event loop over ``samples`` (outages already gaps), the policy's
    forecasts from ``planner`` (None: the configured static split)."""
    placement = placement or CountedGpus()
    backlog = Backlog(jobs, config, placement)
    static = config.static_gpus()
    policy = config.policy_config() if static is None else None
    # A broker starts at half its ceiling, in whole nodes as it always holds them.
    node = config.node_gpus
    inference = placement.inference_to(
        policy.ceiling // 2 // node * node if policy is not None else static or 0
    )
    last_lend: float | None = None
    windows: list[Window] = []
    errors: list[float] = []  # the forecast's relative error, per window with a load
    for index, sample in enumerate(samples):
        now = sample.start_s
        backlog.open_window(now, window_s)
        action, reason, upper, preempted = "static", "", None, 0
        if planner is not None and policy is not None:
            plan = planner.plan(index, samples, windows, backlog)
            last_lend = None if plan.forget_lend else last_lend
            upper = plan.forecast.upper
            if plan.forecast.point is not None and sample.rate is not None:
                errors.append(abs(plan.forecast.point - sample.rate) / sample.rate)
            decision = decide(backlog.snapshot(now, inference, plan, last_lend), policy)
            action, reason = str(decision.action), decision.reason
            preempted = backlog.apply(decision, now)
            inference = placement.inference_to(decision.inference_gpus)
            last_lend = now if decision.action is Action.LEND else last_lend
        backlog.fill(now, config.total_gpus - inference - backlog.held())
        busy_gpu_s = backlog.advance(now, window_s)
        needed = math.ceil(sample.rate / config.per_gpu_rps - 1e-9) if sample.rate else None
        training = backlog.held()
        windows.append(
            Window(now, sample.rate, upper, needed, inference, training, preempted, action, reason)
        )
        backlog.close_window(busy_gpu_s)
    metrics = backlog.metrics(windows, errors, end_s) | placement.metrics()
    if planner is not None:
        scored = metrics["windows"] - metrics["gap_windows"]
        metrics |= planner.metrics(scored, sum(backlog.busy))
    return SimulationResult(config, metrics, windows)
