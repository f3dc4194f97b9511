"""One broker step (observe -> forecast -> decide -> act -> record), and its settings.

The Airflow ``RebalanceOperator``, the ``InferenceLoadSensor``'s trigger and
``tideflow broker run`` all call these functions: the same policy, the same
code, wherever the broker runs.
"""

from __future__ import annotations

import bisect
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from tideflow.broker.calibrate import LostWorkBudget, SloCalibration, TrainingWork, scaled
from tideflow.broker.forecast import LoadForecaster, clean_outages
from tideflow.broker.journal import DecisionJournal, JournalEntry, PreemptionCount
from tideflow.broker.load import (
    LoadSample,
    LoadSource,
    LoadSourceError,
    PrometheusLoad,
    PrometheusSignal,
    ServedWindow,
    ServingSignal,
    SyntheticLatency,
    SyntheticLoad,
    TraceLoad,
)
from tideflow.broker.local import LocalActuator
from tideflow.broker.policy import Decision, GangView, PolicyConfig, Snapshot, decide
from tideflow.broker.throughput import Served, Throughput, ThroughputLearner, recorded


class Actuator(Protocol):
    """What a broker step needs from where it acts (the local ledger, a cluster)."""

    def total_gpus(self) -> int: ...
    def inference_gpus(self) -> int: ...
    def idle_training_gpus(self) -> int: ...
    def gangs(self) -> tuple[GangView, ...]: ...
    def apply(self, decision: Decision) -> Any: ...
    # Training nodes no gang holds (None: the actuator does not place by node), and
    # those holding a lease the broker may not stop.
    def empty_nodes(self) -> int | None: ...
    def pinned_nodes(self) -> frozenset[str]: ...
    # Training's time and stops over a past span (None: no record of them here).
    def training_work(self, since_s: float, until_s: float) -> TrainingWork | None: ...
    # How often the cluster's own queue has preempted each training workload, for the
    # journal to count where the actuator keeps no record of training's work.
    # (None: the actuator does not watch them; the journal then records nothing.)
    def preemption_counts(self) -> tuple[PreemptionCount, ...] | None: ...


class TenantActuator(Actuator, Protocol):
    """An actuator that may act as inference's tenant of the cluster file's teams."""

    @property
    def tenant(self) -> bool: ...
    def capacity(self) -> int: ...
    def least_gpus(self) -> int: ...


BROKER_DAG_ID = "tideflow_broker"  # the Airflow DAG that runs the broker
HISTORY_S = 8 * 86400.0
CALIBRATION_S = 7 * 86400.0  # outcomes the SLO calibration replays
LEARNING_S = 7 * 86400.0  # served windows the per-GPU throughput is learned from
BUDGET_S = 7 * 86400.0  # the past span whose lost and trained GPU-time the budget weighs
# A latency signal describes the minutes before it (a quantile over rate(...[10m])), and
# replicas serve only after they start: a window counts only when inference held the
# same GPUs through it and this long before it.
LATENCY_SETTLE_S = 900.0


class PeriodicTrace:
    """A trace replayed on the wall clock, repeating (t=0 of the trace is a midnight)."""

    def __init__(self, trace: TraceLoad) -> None:
        self.trace = trace
        self.window_s = trace.window_s
        self.period_s = trace.end_s - trace.start_s
        self._rates = {round(s.start_s): s.rate for s in trace.samples(trace.start_s, trace.end_s)}

    def samples(self, start_s: float, end_s: float) -> list[LoadSample]:
        step = self.window_s
        first = math.ceil(start_s / step) * step
        count = max(0, math.ceil((end_s - first) / step))
        grid = [first + i * step for i in range(count)]
        return [
            LoadSample(t, self._rates.get(round(self.trace.start_s + t % self.period_s)))
            for t in grid
        ]


def load_source_from(spec: str) -> LoadSource:
    """``trace:PATH`` (replayed on the clock), ``prometheus:URL|QUERY``, ``synthetic:RPS``."""
    kind, _, value = spec.partition(":")
    if kind == "trace" and value:
        return PeriodicTrace(TraceLoad(value))
    if kind == "prometheus" and "|" in value:
        url, _, query = value.partition("|")
        return PrometheusLoad(url, query)
    if kind == "synthetic":
        mean, _, day = value.partition("@")
        try:
            day_s = float(day) if day else 86400.0
            if day_s >= 144:
                return SyntheticLoad(
                    mean_rps=float(mean or 1000), day_s=day_s, window_s=day_s / 144
                )
        except ValueError:
            pass
    raise LoadSourceError(
        f"TIDEFLOW_BROKER_LOAD={spec!r}: use trace:PATH.csv, prometheus:URL|QUERY "
        "or synthetic:MEAN_RPS[@DAY_S] (a day of DAY_S >= 144 seconds, for demos)"
    )


LATENCY_FORMS = (
    "prometheus:URL|QUERY (the latency at the SLO's percentile, or the share of "
    "requests over the latency target, per window) or synthetic:CAPACITY_RPS (a model "
    "of the serving side whose true per-GPU throughput is CAPACITY_RPS, for demos)"
)


def latency_source_from(spec: str, window_s: float, slo_s: float) -> ServingSignal:
    """``prometheus:URL|QUERY`` or ``synthetic:CAPACITY_RPS`` (``TIDEFLOW_BROKER_LATENCY``)."""
    kind, _, value = spec.partition(":")
    if kind == "prometheus" and "|" in value:
        url, _, query = value.partition("|")
        if url and query:
            return PrometheusSignal(url, query, window_s=window_s)
    if kind == "synthetic":
        try:
            capacity = float(value)
        except ValueError:
            capacity = 0.0
        if capacity > 0 and math.isfinite(capacity) and slo_s > 0:
            return SyntheticLatency(capacity, slo_s=slo_s, window_s=window_s)
    raise LoadSourceError(
        f"TIDEFLOW_BROKER_LATENCY={spec!r}: use {LATENCY_FORMS}"
        + ("; synthetic needs TIDEFLOW_BROKER_LATENCY_SLO_S" if kind == "synthetic" else "")
    )


@dataclass(frozen=True)
class ServedLoad:
    """The load, with the serving side's latency signal beside it and the signal's limit
    (the SLO): the broker then learns its per-GPU throughput (``learned_throughput``)."""

    load: LoadSource
    signal: ServingSignal
    slo: float  # the signal's limit: seconds at the percentile, or the share over target

    @property
    def window_s(self) -> float:
        return self.load.window_s

    @property
    def day_s(self) -> float:
        return float(getattr(self.load, "day_s", 86400.0))

    def samples(self, start_s: float, end_s: float) -> list[LoadSample]:
        return self.load.samples(start_s, end_s)


def day_scale(load: LoadSource) -> float:
    """How much shorter the load's day is than a real one (1: a real day)."""
    return float(getattr(load, "day_s", 86400.0)) / 86400.0


def on_the_loads_clock(config: PolicyConfig, load: LoadSource) -> PolicyConfig:
    """The policy's horizons and cooldown shortened with a compressed day, so a demo's
    broker forecasts, lends and waits as it would over a real one."""
    scale = day_scale(load)
    if scale == 1.0:
        return config
    return replace(
        config,
        lead_s=config.lead_s * scale,
        lend_horizon_s=config.lend_horizon_s * scale,
        cooldown_s=config.cooldown_s * scale,
        # the budget's week shrinks with the day: so does what it charges for a stop
        stop_cost_s=config.stop_cost_s * scale,
    )


@dataclass(frozen=True)
class BrokerSettings:
    load: str
    per_gpu_rps: float
    node_gpus: int = 8
    device_class: str = "gpu"
    min_inference_gpus: int = 0
    grace_s: float = 300.0
    latency: str = ""  # a latency source: learn the per-GPU throughput ("" : configured)
    latency_slo_s: float = 0.0  # the source gives seconds at the SLO's percentile
    latency_slo_share: float = 0.0  # the source gives the share of requests over target
    lost_work_budget: float | None = 0.01  # share of training GPU-time stops may cost
    stop_cost_s: float = 360.0  # per GPU stopped: its checkpoint on notice and restart

    @classmethod
    def from_env(cls) -> BrokerSettings | None:
        """None when no broker is configured (TIDEFLOW_BROKER_LOAD unset)."""
        load = os.environ.get("TIDEFLOW_BROKER_LOAD")
        if not load:
            return None
        values: dict[str, str] = {}
        try:
            for name, default in (
                ("PER_GPU_RPS", ""),
                ("NODE_GPUS", "8"),
                ("MIN_INFERENCE_GPUS", "0"),
                ("GRACE_S", "300"),
                ("LOST_WORK_BUDGET", "0.01"),
                ("STOP_COST_S", "360"),
            ):
                values[name] = os.environ.get(f"TIDEFLOW_BROKER_{name}", default)
            settings = cls(
                load=load,
                per_gpu_rps=float(values["PER_GPU_RPS"] or 0),
                node_gpus=int(values["NODE_GPUS"]),
                device_class=os.environ.get("TIDEFLOW_BROKER_DEVICE_CLASS", "gpu"),
                min_inference_gpus=int(values["MIN_INFERENCE_GPUS"]),
                grace_s=float(values["GRACE_S"]),
                lost_work_budget=_share_or_none(values["LOST_WORK_BUDGET"]),
                stop_cost_s=float(values["STOP_COST_S"]),
            )
        except ValueError:
            raise ValueError(
                f"tideflow broker settings: TIDEFLOW_BROKER_* must be numbers (got {values})"
            ) from None
        if settings.per_gpu_rps <= 0:
            raise ValueError(
                "tideflow broker settings: TIDEFLOW_BROKER_PER_GPU_RPS must be > 0 "
                "(requests/s one inference GPU serves within its latency SLO)"
            )
        if settings.lost_work_budget is not None and not 0 < settings.lost_work_budget < 1:
            raise ValueError(
                "tideflow broker settings: TIDEFLOW_BROKER_LOST_WORK_BUDGET must be a share "
                "of training GPU-time within (0, 1), e.g. 0.01, or 'none' for a fixed lend "
                f"bound (got {values['LOST_WORK_BUDGET']!r})"
            )
        if not 0 <= settings.stop_cost_s < math.inf:
            raise ValueError(
                "tideflow broker settings: TIDEFLOW_BROKER_STOP_COST_S must be seconds >= 0 "
                f"(got {values['STOP_COST_S']!r})"
            )
        return replace(settings, **latency_settings_from_env())

    @property
    def latency_slo(self) -> float:
        return self.latency_slo_s or self.latency_slo_share


def _share_or_none(text: str) -> float | None:
    return None if text.strip().lower() == "none" else float(text)


def latency_settings_from_env() -> dict[str, Any]:
    """``TIDEFLOW_BROKER_LATENCY`` and its SLO (exactly one of ``_SLO_S``, ``_SLO_SHARE``)."""
    spec = os.environ.get("TIDEFLOW_BROKER_LATENCY", "")
    limits: dict[str, float] = {}
    for name, field_name, accepted, most in (
        ("LATENCY_SLO_S", "latency_slo_s", "seconds > 0", math.inf),
        ("LATENCY_SLO_SHARE", "latency_slo_share", "a share within (0, 1)", 1.0),
    ):
        text = os.environ.get(f"TIDEFLOW_BROKER_{name}", "")
        if not text:
            continue
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and 0 < value < most):
            raise ValueError(
                f"tideflow broker settings: TIDEFLOW_BROKER_{name}={text!r} must be {accepted}"
            )
        limits[field_name] = value
    if not spec:
        if limits:
            raise ValueError(
                "tideflow broker settings: "
                + " and ".join(f"TIDEFLOW_BROKER_{n.upper()}" for n in limits)
                + f" set without TIDEFLOW_BROKER_LATENCY ({LATENCY_FORMS})"
            )
        return {}
    if len(limits) != 1:
        raise ValueError(
            f"tideflow broker settings: TIDEFLOW_BROKER_LATENCY={spec!r} needs exactly one "
            "of TIDEFLOW_BROKER_LATENCY_SLO_S (the source gives the latency in seconds at "
            "the SLO's percentile) or TIDEFLOW_BROKER_LATENCY_SLO_SHARE (the source gives "
            "the share of requests over the latency target)"
        )
    latency_source_from(spec, 60.0, limits.get("latency_slo_s", 0.0))  # its form, checked now
    return {"latency": spec, **limits}


def served(settings: BrokerSettings, load: LoadSource) -> LoadSource:
    """The load, with the latency source beside it when one is set."""
    if not settings.latency:
        return load
    if not (settings.latency_slo_s > 0) ^ (settings.latency_slo_share > 0):
        raise ValueError(
            f"tideflow broker settings: latency {settings.latency!r} needs exactly one of "
            "latency_slo_s (TIDEFLOW_BROKER_LATENCY_SLO_S) or latency_slo_share "
            "(TIDEFLOW_BROKER_LATENCY_SLO_SHARE) > 0"
        )
    signal = latency_source_from(settings.latency, load.window_s, settings.latency_slo_s)
    return ServedLoad(load, signal, settings.latency_slo)


def policy_config(settings: BrokerSettings, total_gpus: int) -> PolicyConfig:
    return PolicyConfig(
        total_gpus=total_gpus,
        per_gpu_rps=settings.per_gpu_rps,
        node_gpus=settings.node_gpus,
        min_inference_gpus=settings.min_inference_gpus,
        headroom=0.05,
        lead_s=600.0,
        checkpoint_grace_s=settings.grace_s,
        lost_work_budget=settings.lost_work_budget,
        stop_cost_s=settings.stop_cost_s,
    )


def coverage(entries: list[JournalEntry], window_s: float) -> list[bool]:
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
    entries: Sequence[JournalEntry],
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
) -> Decision:
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
) -> tuple[Decision, Snapshot]:
    """The decision now and what it was made from, its reason saying which per-GPU
    throughput and lend bound it was made with."""
    config, learned = with_learned_throughput(load, config, journal, now_s)
    bound = lend_bound(load, actuator, config, now_s, journal)
    snapshot = observe(
        load, actuator, config, journal, now_s, lend_margin=bound.margin if bound else 0.0
    )
    decision = decide(snapshot, config)
    notes = [x.reason for x in (learned, bound) if x is not None]
    if notes:
        decision = replace(decision, reason="; ".join([decision.reason, *notes]))
    return decision, snapshot


def within_inference_quota(
    config: PolicyConfig, actuator: TenantActuator, settings: BrokerSettings
) -> PolicyConfig:
    """The policy's bounds when the broker is inference's tenant (``tideflow.broker.tenant``).

    The decision then moves within inference's declared nominal quota in whole nodes,
    and never below what the actuator keeps anyway (``least_gpus``: on a cluster, the
    part of the quota inference's rules let nobody borrow), so that the journal records
    what is held rather than a number the actuator would correct.
    """
    if not actuator.tenant:
        return config
    node = settings.node_gpus
    most = actuator.capacity() // node * node
    if most == 0:
        # A quota declared only for another model, or below one node, would cap the
        # broker at nothing and hand every inference node to training.
        raise ValueError(
            f"tideflow broker: team inference's {settings.device_class} quota in the "
            f"cluster file holds no whole node of {node} GPU(s) for the devices the broker "
            f"moves (quota {actuator.capacity()}); declare inference a quota of at least "
            f"{node} for the class, or for the model of the pool's nodes"
        )
    if most < settings.min_inference_gpus:
        raise ValueError(
            f"tideflow broker: team inference's {settings.device_class} quota in the "
            f"cluster file holds {most} GPU(s) in whole nodes of {node}, below the "
            f"broker's min_inference_gpus {settings.min_inference_gpus}"
        )
    least = min(most, -(-actuator.least_gpus() // node) * node)
    return replace(
        config,
        max_inference_gpus=most,
        min_inference_gpus=max(config.min_inference_gpus, least),
    )


def open_local(
    settings: BrokerSettings, ledger_path: Path, journal_path: Path, cluster_file: str | None
) -> tuple[LoadSource, LocalActuator, PolicyConfig, DecisionJournal]:
    """The pieces of a local broker, from its settings and the shared state files."""
    from tideflow.backends.local import LocalBackend
    from tideflow.gangs import open_ledger

    ledger = open_ledger(ledger_path, cluster_file)
    backend = LocalBackend(ledger_path.parent / "gangs")
    actuator = LocalActuator(
        ledger,
        backend,
        node_gpus=settings.node_gpus,
        device_class=settings.device_class,
        grace_s=settings.grace_s,
        checkpoint_store=backend.checkpoint_store,
    )
    total = actuator.total_gpus()
    if total == 0:
        raise ValueError(
            f"tideflow broker: the inventory has no {settings.device_class} devices "
            "(set TIDEFLOW_CLUSTER_FILE to a cluster that has them)"
        )
    load = served(settings, load_source_from(settings.load))
    config = on_the_loads_clock(policy_config(settings, total), load)
    config = within_inference_quota(config, actuator, settings)
    return load, actuator, config, DecisionJournal(journal_path)


def open_kubernetes(
    settings: BrokerSettings, journal_path: Path, api_client: Any
) -> tuple[LoadSource, Any, PolicyConfig, DecisionJournal]:
    """The pieces of a broker acting on a cluster (``tideflow.broker.kubernetes``), the
    objects it moves named by ``TIDEFLOW_K8S_*`` and its teams by ``TIDEFLOW_CLUSTER_FILE``."""
    from tideflow.broker.kubernetes import KubernetesActuator, target_from_env

    actuator = KubernetesActuator(
        api_client, target_from_env(), grace_s=settings.grace_s, node_gpus=settings.node_gpus
    )
    load = served(settings, load_source_from(settings.load))
    config = on_the_loads_clock(policy_config(settings, actuator.total_gpus()), load)
    config = within_inference_quota(config, actuator, settings)
    return load, actuator, config, DecisionJournal(journal_path)


def rebalance_once(
    load: LoadSource,
    actuator: Actuator,
    config: PolicyConfig,
    journal: DecisionJournal,
    now_s: float | None = None,
    *,
    act: bool = True,
) -> tuple[Decision, Any]:
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
    return decision, applied
