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
from pathlib import Path
from typing import Any, Protocol

from tideflow.broker.calibrate import LostWorkBudget, SloCalibration, TrainingWork, scaled
from tideflow.broker.forecast import LoadForecaster, clean_outages
from tideflow.broker.journal import DecisionJournal, JournalEntry, PreemptionCount
from tideflow.broker.load import LoadSample, LoadSource, ServedWindow, ServingSignal
from tideflow.broker.load import LoadSourceError as LoadSourceError  # noqa: PLC0414 (callers)
from tideflow.broker.local import LocalActuator
from tideflow.broker.node_size import local_node_gpus, node_gpus
from tideflow.broker.policy import Decision, GangView, PolicyConfig, Snapshot, decide, sizing
from tideflow.broker.settings import BrokerSettings, latency_source_from, load_source_from
from tideflow.broker.throughput import Served, Throughput, ThroughputLearner, recorded
from tideflow.config import ConfigError, bad_setting


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


def served(settings: BrokerSettings, load: LoadSource) -> LoadSource:
    """The load, with the latency source beside it when one is set."""
    if not settings.latency:
        return load
    if not (settings.latency_slo_s > 0) ^ (settings.latency_slo_share > 0):
        raise ConfigError(
            f"latency {settings.latency!r} needs exactly one of "
            "latency_slo_s (TIDEFLOW_BROKER_LATENCY_SLO_S) or latency_slo_share "
            "(TIDEFLOW_BROKER_LATENCY_SLO_SHARE) > 0"
        )
    signal = latency_source_from(settings.latency, load.window_s, settings.latency_slo_s)
    return ServedLoad(load, signal, settings.latency_slo)


def policy_config(
    settings: BrokerSettings, total_gpus: int, node: int | None = None
) -> PolicyConfig:
    """The policy's configuration from the settings, with ``node`` GPUs per node (the
    settings' own when not given, else the policy's default); every other default is the
    policy's own."""
    return PolicyConfig(
        total_gpus=total_gpus,
        per_gpu_rps=settings.per_gpu_rps,
        node_gpus=node or settings.node_gpus or PolicyConfig.node_gpus,
        min_inference_gpus=settings.min_inference_gpus,
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

    The decision then moves within inference's declared nominal quota in whole nodes
    (of ``config.node_gpus``), and never below what the actuator keeps anyway
    (``least_gpus``: on a cluster, the part of the quota inference's rules let nobody
    borrow), so that the journal records what is held rather than a number the
    actuator would correct.
    """
    if not actuator.tenant:
        return config
    node = config.node_gpus
    most = actuator.capacity() // node * node
    if most == 0:
        # A quota declared only for another model, or below one node, would cap the
        # broker at nothing and hand every inference node to training.
        raise ConfigError(
            f"tideflow broker: team inference's {settings.device_class} quota in the "
            f"cluster file holds no whole node of {node} GPU(s) for the devices the broker "
            f"moves (quota {actuator.capacity()}); declare inference a quota of at least "
            f"{node} for the class, or for the model of the pool's nodes"
        )
    if most < settings.min_inference_gpus:
        raise ConfigError(
            f"tideflow broker: team inference's {settings.device_class} quota in the "
            f"cluster file holds {most} GPU(s) in whole nodes of {node}, below the "
            f"broker's min_inference_gpus {settings.min_inference_gpus} "
            "(TIDEFLOW_BROKER_MIN_INFERENCE_GPUS)"
        )
    least = min(most, -(-actuator.least_gpus() // node) * node)
    return replace(
        config,
        max_inference_gpus=most,
        min_inference_gpus=max(config.min_inference_gpus, least),
    )


def checked_policy(settings: BrokerSettings, total: int, node: int) -> PolicyConfig:
    """``policy_config``, its refusals ``ConfigError`` naming the variables behind them."""
    if settings.min_inference_gpus > total:
        raise bad_setting(
            "TIDEFLOW_BROKER_MIN_INFERENCE_GPUS",
            str(settings.min_inference_gpus),
            f"a whole number within 0..{total}",
            f"the broker moves {total} {settings.device_class} devices",
        )
    try:
        return policy_config(settings, total, node)
    except ValueError as exc:  # a node size that does not divide the total, say
        raise ConfigError(f"{exc} (from TIDEFLOW_BROKER_* and the nodes)") from None


def open_local(
    settings: BrokerSettings, ledger_path: Path, journal_path: Path, cluster_file: str | None
) -> tuple[LoadSource, LocalActuator, PolicyConfig, DecisionJournal]:
    """The pieces of a local broker, from its settings and the shared state files.

    Every setting is checked before the ledger and the journal are opened (created):
    one the broker cannot use (``ConfigError``) leaves no state behind."""
    from types import SimpleNamespace

    from tideflow.backends.local import LocalBackend
    from tideflow.inventory import inventory_for
    from tideflow.scheduling import LeaseLedger
    from tideflow.scheduling.quota import Teams
    from tideflow.spec import SpecError

    try:
        inventory = inventory_for(cluster_file)
    except SpecError as exc:  # located in the file; the setting that named it, named too
        text = str(exc.issues[0]) if len(exc.issues) == 1 else str(exc)
        raise ConfigError(f"TIDEFLOW_CLUSTER_FILE={cluster_file!r}: {text}") from None
    node = local_node_gpus(inventory, cluster_file, settings)
    load = served(settings, load_source_from(settings.load))
    total = sum(n.devices for n in inventory.nodes if n.device_class == settings.device_class)
    config = on_the_loads_clock(checked_policy(settings, total, node), load)

    def actuator_on(ledger: Any, backend: LocalBackend | None) -> LocalActuator:
        return LocalActuator(
            ledger,
            backend,
            node_gpus=node,
            device_class=settings.device_class,
            grace_s=settings.grace_s,
            checkpoint_store=backend.checkpoint_store if backend else None,
        )

    # inference's quota, read from the inventory alone: what the ledger would say of it
    unopened = SimpleNamespace(inventory=inventory, teams=Teams.of(inventory))
    config = within_inference_quota(config, actuator_on(unopened, None), settings)
    ledger_path.parent.mkdir(parents=True, exist_ok=True)
    actuator = actuator_on(
        LeaseLedger(ledger_path, inventory), LocalBackend(ledger_path.parent / "gangs")
    )
    return load, actuator, config, DecisionJournal(journal_path)


def open_kubernetes(
    settings: BrokerSettings, journal_path: Path, api_client: Any
) -> tuple[LoadSource, Any, PolicyConfig, DecisionJournal]:
    """The pieces of a broker acting on a cluster (``tideflow.broker.kubernetes``), the
    objects it moves named by ``TIDEFLOW_K8S_*`` and its teams by ``TIDEFLOW_CLUSTER_FILE``.
    Its node size is ``TIDEFLOW_BROKER_NODE_GPUS`` when set, else the GPU nodes' own."""
    from tideflow.broker.kubernetes import KubernetesActuator, target_from_env

    actuator = KubernetesActuator(
        api_client, target_from_env(), grace_s=settings.grace_s, node_gpus=settings.node_gpus
    )
    if actuator.node_gpus is None:
        actuator.node_gpus = _cluster_node_gpus(actuator)
    load = served(settings, load_source_from(settings.load))
    config = on_the_loads_clock(
        checked_policy(settings, actuator.total_gpus(), actuator.node_gpus), load
    )
    config = within_inference_quota(config, actuator, settings)
    return load, actuator, config, DecisionJournal(journal_path)


def _cluster_node_gpus(actuator: Any) -> int:
    """The size of the cluster's GPU nodes, from their allocatable GPUs."""
    target = actuator.target
    sizes = actuator.node_sizes()
    if not sizes:
        raise bad_setting(
            "TIDEFLOW_K8S_NODE_SELECTOR",
            target.node_selector,
            "a label selector matching the GPU nodes",
            f"no node it selects has allocatable {target.gpu_resource}",
        )
    where = f"the cluster ({target.node_selector})"
    return node_gpus(sizes, None, actuator.device_class, where)


@dataclass(frozen=True)
class Step:
    """One broker step: when, what it decided, what the actuator did (None in a dry
    run) and what the decision was made from."""

    now_s: float
    decision: Decision
    applied: Any
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
) -> tuple[Decision, Any]:
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
