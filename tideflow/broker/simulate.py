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
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol

from tideflow.broker.backlog import Backlog, CountedGpus, Placement
from tideflow.broker.calibrate import LostWorkBudget, SloCalibration, scaled
from tideflow.broker.cron import CronSchedule
from tideflow.broker.forecast import Forecast, LoadForecaster, clean_outages
from tideflow.broker.jobs import JobSpec
from tideflow.broker.load import LoadSample, LoadSource
from tideflow.broker.policy import Action, PolicyConfig, decide

HISTORY_S = 8 * 86400.0  # the forecaster looks back a week and a day
# The simulator runs the policy with the running broker's defaults: one place for each.
_POLICY: dict[str, Any] = {f.name: f.default for f in fields(PolicyConfig)}


@dataclass(frozen=True)
class SimulationConfig:
    policy: str  # "tidal", "static:N" (N GPUs for inference) or "cron:H" (headroom H)
    total_gpus: int = 200
    node_gpus: int = _POLICY["node_gpus"]
    per_gpu_rps: float = 25.0
    headroom: float = _POLICY["headroom"]
    lead_s: float = _POLICY["lead_s"]  # one window: reclaiming with a checkpoint fits in it
    forecast_quantile: float = 0.99
    lend_horizon_s: float = _POLICY["lend_horizon_s"]
    lend_quantile: float = _POLICY["lend_quantile"]
    cooldown_s: float = _POLICY["cooldown_s"]
    min_inference_gpus: int = _POLICY["min_inference_gpus"]
    restart_overhead_s: float = 300.0  # a restarted gang's start-up, GPU time without progress
    checkpoint_write_s: float = 60.0  # time for a gang to write its checkpoint on notice
    grace_s: float = _POLICY["checkpoint_grace_s"]  # how long the broker waits for it
    # Scale the forecast's upper bound online to meet this SLO (None: uncalibrated).
    slo_target: float | None = 0.995
    slo_step: float = 0.05  # the calibration's step per window (``SloCalibration.step``)
    elastic: bool = True  # shrink elastic gangs instead of stopping them (False: all rigid)
    # Scale the lend horizon's bound online to spend this share of training GPU-time on
    # preemptions (None: a fixed lend bound): under budget lend more, over it less.
    lost_work_budget: float | None = _POLICY["lost_work_budget"]
    lost_work_low: float = -0.25  # under budget the lend bound shrinks to exp(-0.25) = 0.78x
    lost_work_high: float = 0.0  # over budget: the fixed bound (> 0: a brake, holding more)
    # The budget counts the work lost and done over this past span, as the running
    # broker reads it from the ledger (None: since the start of the trace).
    lost_work_window_s: float | None = 7 * 86400.0

    def static_gpus(self) -> int | None:
        if self.policy == "tidal" or self.cron_headroom() is not None:
            return None
        kind, _, value = self.policy.partition(":")
        if kind != "static" or not value.isdigit():
            raise ValueError(
                f"policy {self.policy!r}: use 'tidal', 'static:N' (N GPUs for inference) "
                "or 'cron:H' (an hour-of-day schedule with headroom H, e.g. cron:0.2)"
            )
        node, total = self.node_gpus, self.total_gpus
        if not 0 <= int(value) <= total or int(value) % max(node, 1):
            # the broker moves whole nodes: a split inside a node is not one it can hold
            raise ValueError(
                f"policy {self.policy!r}: N is inference's GPUs in whole {node}-GPU nodes "
                f"of the {total}: accepted: 0, {node}, {2 * node}, ... {total // node * node}"
            )
        return int(value)

    def cron_headroom(self) -> float | None:
        kind, _, value = self.policy.partition(":")
        if kind != "cron":
            return None
        try:
            headroom = float(value)
        except ValueError:
            headroom = -1.0
        if not 0 <= headroom < 10:
            raise ValueError(f"policy {self.policy!r}: H is a headroom fraction >= 0 (cron:0.2)")
        return headroom

    def policy_config(self) -> PolicyConfig:
        return PolicyConfig(
            total_gpus=self.total_gpus,
            per_gpu_rps=self.per_gpu_rps,
            node_gpus=self.node_gpus,
            headroom=self.headroom,
            min_inference_gpus=self.min_inference_gpus,
            lead_s=self.lead_s,
            lend_horizon_s=self.lend_horizon_s,
            lend_quantile=self.lend_quantile,
            cooldown_s=self.cooldown_s,
            checkpoint_grace_s=self.grace_s,
        )


@dataclass(frozen=True)
class Window:
    start_s: float
    rate: float | None
    forecast_upper: float | None
    needed: int | None
    inference_gpus: int
    training_gpus: int
    preempted: int
    action: str
    reason: str


@dataclass
class SimulationResult:
    config: SimulationConfig
    metrics: dict[str, Any]
    windows: list[Window] = field(default_factory=list)

    def to_json(self, timeline: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"policy": self.config.policy, **self.metrics}
        out["config"] = asdict(self.config)
        if timeline:
            out["timeline"] = [asdict(w) for w in self.windows]
        return out


@dataclass(frozen=True)
class Plan:
    """What the policy sees of the load in one window."""

    forecast: Forecast  # over the lead
    lend_forecast: Forecast  # over the lend horizon
    measured_rps: float | None  # the last window's load (None: a gap)
    forget_lend: bool = False  # True: no cooldown after the last lend this window


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
