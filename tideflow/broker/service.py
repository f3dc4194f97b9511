"""One broker step (observe -> forecast -> decide -> act -> record).

Its settings are read and checked in ``tideflow.broker.settings``.

The Airflow ``RebalanceOperator``, the ``InferenceLoadSensor``'s trigger and
``tideflow broker run`` all call these functions: the same policy, the same
code, wherever the broker runs.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tideflow.broker.actuator import Actuator, Applied, TenantActuator
from tideflow.broker.calibrate import LostWorkBudget, SloCalibration, scaled
from tideflow.broker.forecast import HISTORY_S, LoadForecaster, clean_outages
from tideflow.broker.journal import DecisionJournal, DecisionRecord
from tideflow.broker.load import LoadSource, ServedWindow
from tideflow.broker.load import LoadSourceError as LoadSourceError  # noqa: PLC0414 (callers)
from tideflow.broker.opening import (
    ServedLoad,
    checked_policy,
    day_scale,
    on_the_loads_clock,
    open_kubernetes,
    open_local,
    policy_config,
    served,
    within_inference_quota,
)
from tideflow.broker.policy import BrokerDecision, PolicyConfig, Snapshot, decide, sizing
from tideflow.broker.settings import BROKER_DAG_ID, BrokerSettings, load_source_from
from tideflow.broker.throughput import Served, Throughput, ThroughputLearner, recorded

# What callers import from here, the broker's opening and actuator protocols included.
__all__ = [
    "BROKER_DAG_ID",
    "BUDGET_S",
    "CALIBRATION_S",
    "HISTORY_S",
    "LATENCY_SETTLE_S",
    "LEARNING_S",
    "Actuator",
    "BrokerSettings",
    "LendBound",
    "LoadSourceError",
    "ServedLoad",
    "Step",
    "TenantActuator",
    "checked_policy",
    "coverage",
    "day_scale",
    "learned_throughput",
    "lend_bound",
    "load_source_from",
    "observe",
    "on_the_loads_clock",
    "open_kubernetes",
    "open_local",
    "peek",
    "policy_config",
    "rebalance_once",
    "rebalance_step",
    "served",
    "served_windows",
    "step_line",
    "with_learned_throughput",
    "within_inference_quota",
]

CALIBRATION_S = 7 * 86400.0  # outcomes the SLO calibration replays
LEARNING_S = 7 * 86400.0  # served windows the per-GPU throughput is learned from
BUDGET_S = 7 * 86400.0  # the past span whose lost and trained GPU-time the budget weighs
# A latency signal describes the minutes before it (a quantile over rate(...[10m])), and
# replicas serve only after they start: a window counts only when inference held the
# same GPUs through it and this long before it.
LATENCY_SETTLE_S = 900.0


def coverage(entries: list[DecisionRecord], window_s: float) -> list[bool]:
    """Per load window, oldest first: did the inference GPUs held cover the load measured?

    Each decision records the need measured over the window before it; the
    GPUs held through that window are those the steps before it left at its end:
    what their actuator reached, not what they decided (short when it could not
    take them, unchanged in a dry run). Decisions are more frequent than load
    windows, so one outcome per window: its last decision's need (the window
    measured most completely) against those GPUs, never against what an earlier
    step in the same window grew to after measuring the miss.
    """
    outcomes: dict[int, bool] = {}
    held: int | None = None  # what the latest step left
    window: int | None = None
    held_through: int | None = None  # what the window before the current one ended with
    for entry in entries:
        current = int(entry.at_s // window_s)
        if current != window:  # the first step in it: the window before ended with `held`
            window, held_through = current, held
        if entry.needed is not None and held_through is not None:
            outcomes[current] = held_through >= entry.needed
        held = entry.gpus_held
    return [outcomes[k] for k in sorted(outcomes)]


def served_windows(
    load: LoadSource,
    entries: Sequence[DecisionRecord],
    start_s: float,
    now_s: float,
    settle_s: float = 0.0,
) -> list[ServedWindow]:
    """The load's complete windows in [start_s, now_s), each with the GPUs that served it.

    A window's GPUs are the most inference held during it (the allocation the last
    decision before it left, and any decided within it), so that its per-GPU rate is
    never overstated. A window has none (it teaches nothing) before the first decision
    journaled, and when the GPUs held changed within ``settle_s`` before it or during
    it: its latency may still describe the allocation before.
    """
    times = [e.at_s for e in entries]
    out = []
    for sample in load.samples(start_s, now_s):
        end = sample.start_s + load.window_s
        if end > now_s:
            break
        first = bisect.bisect_right(times, sample.start_s - settle_s) - 1
        last = bisect.bisect_left(times, end)
        held = [e.gpus_held for e in entries[first:last]] if first >= 0 else []
        steady = len(set(held)) == 1
        out.append(ServedWindow(sample.start_s, sample.rate, held[0] if steady else 0))
    return out


def learned_throughput(
    load: LoadSource, config: PolicyConfig, journal: DecisionJournal, now_s: float
) -> Throughput | None:
    """The per-GPU throughput learned from the windows served (None: no latency source).

    Replayed at every step from the journal (the GPUs held), the load and the latency
    over the last ``LEARNING_S``, from the rate the journal's last decision says was
    learned (the configured rate, ``config.per_gpu_rps``, when none was): evidence older
    than that history keeps the estimate where it put it.
    """
    if not isinstance(load, ServedLoad):
        return None
    start = now_s - LEARNING_S * day_scale(load)
    entries = journal.since(start - load.window_s)
    carried = recorded(entries[-1].reason, config.per_gpu_rps) if entries else None
    settle = max(load.window_s, LATENCY_SETTLE_S * day_scale(load))
    windows = served_windows(load, entries, start, now_s, settle)
    observations = [
        Served(w.rate, w.gpus, signal)
        for w, signal in zip(windows, load.signal.signals(windows), strict=True)
    ]
    return ThroughputLearner().learn(observations, config.per_gpu_rps, load.slo, carried)


def with_learned_throughput(
    load: LoadSource, config: PolicyConfig, journal: DecisionJournal, now_s: float
) -> tuple[PolicyConfig, Throughput | None]:
    learned = learned_throughput(load, config, journal, now_s)
    if learned is None:
        return config, None
    return replace(config, per_gpu_rps=learned.rps), learned


@dataclass(frozen=True)
class LendBound:
    """How the lost-work budget scales the lend horizon's bound now, and why."""

    margin: float  # log scale: the bound is multiplied by exp(margin)
    reason: str


def lend_bound(
    load: LoadSource,
    actuator: Actuator,
    config: PolicyConfig,
    now_s: float,
    journal: DecisionJournal | None = None,
) -> LendBound | None:
    """The lost-work budget's scaling of the lend bound, from the work training did and
    lost over the past ``BUDGET_S`` (``calibrate.LostWorkBudget``, as the simulator
    measures it): the actuator's record (the local ledger's usage), else the broker's
    own journal (a cluster keeps none: the training GPUs and stops at each step). None
    with no budget, with neither record, or when no training ran over that span: the
    fixed bound."""
    if config.lost_work_budget is None:
        return None
    scale = day_scale(load)
    since = now_s - BUDGET_S * scale
    work = actuator.training_work(since, now_s)
    if work is None and journal is not None:
        work = journal.training_work(since, now_s)
    if work is None or work.trained_gpu_s <= 0:
        return None
    budget = LostWorkBudget.for_cluster(config.lost_work_budget, config.total_gpus, 86400 * scale)
    lost = work.lost_gpu_s(config.stop_cost_s)
    margin = budget.margin(lost, work.trained_gpu_s)
    allowed = budget.budget * work.trained_gpu_s
    return LendBound(
        margin,
        f"lost work {lost / 3600:.1f} of a {allowed / 3600:.1f} GPU-h budget "
        f"({budget.budget:.2%} of training's {work.trained_gpu_s / 3600:.1f} GPU-h over "
        f"{BUDGET_S * scale / 86400:g} d): lend bound x{math.exp(margin):.2f}",
    )


def observe(
    load: LoadSource,
    actuator: Actuator,
    config: PolicyConfig,
    journal: DecisionJournal,
    now_s: float,
    *,
    lend_margin: float = 0.0,
) -> Snapshot:
    """Everything the policy needs, read now; the load from before ``now`` only.
    ``lend_margin`` scales the lend horizon's bound (``lend_bound``)."""
    scale = day_scale(load)
    history = clean_outages(load.samples(now_s - HISTORY_S * scale, now_s))
    forecaster = LoadForecaster(load.window_s, quantile=0.99)
    last = history[-1].rate if history else None
    outcomes = coverage(journal.since(now_s - CALIBRATION_S * scale), load.window_s)
    margin = SloCalibration().replay(outcomes)
    return Snapshot(
        now_s=now_s,
        inference_gpus=actuator.inference_gpus(),
        measured_rps=last,
        forecast=scaled(forecaster.forecast(history, now_s, config.lead_s), margin),
        idle_training_gpus=actuator.idle_training_gpus(),
        empty_nodes=actuator.empty_nodes(),
        pinned_nodes=actuator.pinned_nodes(),
        gangs=actuator.gangs(),
        last_lend_s=journal.last_lend_s(),
        lend_forecast=scaled(
            forecaster.forecast(history, now_s, config.lend_horizon_s, config.lend_quantile),
            lend_margin,
        ),
    )


def peek(
    load: LoadSource,
    actuator: Actuator,
    config: PolicyConfig,
    journal: DecisionJournal,
    now_s: float | None = None,
) -> BrokerDecision:
    """What the broker would decide now, without acting or recording (for sensors)."""
    now = time.time() if now_s is None else now_s
    decision, _ = _decided(load, actuator, config, journal, now)
    return decision


def _decided(
    load: LoadSource,
    actuator: Actuator,
    config: PolicyConfig,
    journal: DecisionJournal,
    now_s: float,
) -> tuple[BrokerDecision, Snapshot]:
    """The decision now and what it was made from, its reason saying which per-GPU
    throughput and lend bound it was made with."""
    config, learned = with_learned_throughput(load, config, journal, now_s)
    with actuator.observing():
        bound = lend_bound(load, actuator, config, now_s, journal)
        snapshot = observe(
            load, actuator, config, journal, now_s, lend_margin=bound.margin if bound else 0.0
        )
    decision = decide(snapshot, config)
    notes = [x.reason for x in (learned, bound) if x is not None]
    if notes:
        decision = replace(decision, reason="; ".join([decision.reason, *notes]))
    return decision, snapshot


@dataclass(frozen=True)
class Step:
    """One broker step: when, what it decided, what the actuator did (None in a dry
    run) and what the decision was made from."""

    now_s: float
    decision: BrokerDecision
    applied: Applied | None
    snapshot: Snapshot
    config: PolicyConfig


def step_line(step: Step, dry_run: bool) -> str:
    """A step as ``tideflow broker run`` prints it: the decision, when, the load read,
    the forecast and the GPUs needed (rounded up to whole nodes, where it is), the reason.
    A dry run says so, and what it would have done."""
    decision, snapshot = step.decision, step.snapshot
    held = step.applied.inference_gpus if step.applied else decision.inference_gpus
    head = f"{decision.action}: {held} inference GPUs of {step.config.total_gpus}"
    if dry_run:
        head = f"dry run (nothing moved): would {head}"
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(step.now_s))
    rps = snapshot.measured_rps
    upper = snapshot.forecast.upper
    load = "load: no data" if rps is None else f"load {rps:.0f} rps"
    forecast = "forecast: none" if upper is None else f"forecast {upper:.0f} rps"
    return f"{head}: {when}, {load}, {forecast}; {sizing(decision, step.config)}; {decision.reason}"


def rebalance_once(
    load: LoadSource,
    actuator: Actuator,
    config: PolicyConfig,
    journal: DecisionJournal,
    now_s: float | None = None,
    *,
    act: bool = True,
) -> tuple[BrokerDecision, Applied | None]:
    step = rebalance_step(load, actuator, config, journal, now_s, act=act)
    return step.decision, step.applied


def rebalance_step(
    load: LoadSource,
    actuator: Actuator,
    config: PolicyConfig,
    journal: DecisionJournal,
    now_s: float | None = None,
    *,
    act: bool = True,
) -> Step:
    """Observe, decide, act (unless ``act`` is False: a dry run) and record, once."""
    now = time.time() if now_s is None else now_s
    decision, snapshot = _decided(load, actuator, config, journal, now)
    applied = actuator.apply(decision) if act else None
    stopped = applied.stopped_gpus if applied else 0
    journal.record(
        now,
        decision,
        total_gpus=config.total_gpus,
        measured_rps=snapshot.measured_rps,
        forecast_upper=snapshot.forecast.upper,
        applied=applied.note if applied else "",
        # what inference holds now: short of the decision when the actuator could not
        # take the GPUs, unchanged in a dry run (the SLO and the learner judge these)
        held_gpus=applied.inference_gpus if applied else snapshot.inference_gpus,
        # what training holds after the step and what the step stopped: the lost-work
        # budget's record where the actuator keeps none (a cluster)
        training_gpus=max(
            0,
            actuator.total_gpus()
            - snapshot.inference_gpus
            - snapshot.idle_training_gpus
            - (stopped or 0),
        ),
        stopped_gpus=stopped,
    )
    counts = actuator.preemption_counts()
    if counts is not None:
        journal.record_preemptions(now, counts)
    return Step(now, decision, applied, snapshot, config)
