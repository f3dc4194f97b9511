"""Replay a load trace in simulated time against a backlog of training gangs.

Per window (the trace's, e.g. 600 s): the policy sees only the samples before
the window and decides the inference allocation; reclaimed gangs checkpoint
(when the grace allows) and go back to the queue; queued gangs start in
submission order with backfill when their whole gang fits; running gangs
advance. Afterwards each window is scored against the load it really had.

Elastic gangs (``JobSpec.min_gpus``) are shrunk instead of stopped when the
policy says so, restart-based as on the local backend: the gang checkpoints on
notice, restarts on the workers it keeps (its start-up again) and runs on at
a speed in proportion to its GPUs; it grows back to full size, with another
restart, when the GPUs are free after the queue has been served.

Simplifications, the same for every policy: GPUs are counted, not placed (the
policy moves whole nodes and gangs are whole nodes, so counting is placing);
inference capacity moves at the start of a window.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from tideflow.broker.calibrate import LostWorkBudget, SloCalibration, scaled
from tideflow.broker.cron import CronSchedule
from tideflow.broker.forecast import Forecast, LoadForecaster, clean_outages
from tideflow.broker.hindsight import hindsight_bounds
from tideflow.broker.jobs import JobSpec
from tideflow.broker.load import LoadSample, LoadSource
from tideflow.broker.nodes import NodePool
from tideflow.broker.policy import Action, GangView, PolicyConfig, Snapshot, decide

HISTORY_S = 8 * 86400.0  # the forecaster looks back a week and a day
# Not policies: what a forecast could reach (``oracle-hindsight``: a richer forecast
# fitted to the trace it is scored on; ``-cross``: to the other half of the trace).
BOUNDS = ("oracle", "oracle-burst-blind", "oracle-hindsight", "oracle-hindsight-cross")
# The bounds that replace tidal's next-window forecast and may keep the rest of tidal.
FORECAST_BOUNDS = ("oracle", "oracle-hindsight", "oracle-hindsight-cross")
MECHANICS = ("lean", "cooldown", "lend", "tidal")  # ``SimulationConfig.bound_mechanics``


def burst_blind_plan(
    load: LoadSource,
    samples: list[LoadSample],
    insured_share: float,
    room: float | None = None,
) -> tuple[list[float | None], list[float | None]]:
    """The burst-blind bound's knowledge and plan, per window: the load without its
    burst, and what it holds room for (that load times ``room``, by default the burst
    factor, in the ``insured_share`` of windows of least load, where the room costs
    least; the load alone elsewhere). Bursts fall on windows no one can foresee, so a
    share of the windows insured catches about that share of them; holding the room
    where load is least is the cheapest way to catch a given share. With every window
    insured and a smaller room, it is the bound of a policy that holds the same room at
    every hour, as a forecast's quantile does."""
    burst_at = getattr(load, "burst_at", None)
    factor = getattr(load, "burst_factor", None)
    if burst_at is None or factor is None:
        raise ValueError(
            "policy 'oracle-burst-blind' needs a load that says which windows burst "
            f"(burst_at and burst_factor, as SyntheticLoad has); {type(load).__name__} does not"
        )
    if not 0 <= insured_share <= 1:
        raise ValueError(f"insured_share must be within [0, 1] (got {insured_share})")
    if room is not None and not room >= 1:
        raise ValueError(f"burst_room must be at least 1, the calm load (got {room})")
    base = [
        None if s.rate is None else s.rate / factor if burst_at(s.start_s) else s.rate
        for s in samples
    ]
    known = sorted((b, i) for i, b in enumerate(base) if b is not None)
    insured = {i for _, i in known[: math.ceil(insured_share * len(known))]}
    held = factor if room is None else room
    plan = [None if b is None else b * held if i in insured else b for i, b in enumerate(base)]
    return base, plan


@dataclass(frozen=True)
class SimulationConfig:
    # "tidal", "static:N" (N GPUs for inference), "cron:H" (headroom H), or a bound:
    # "oracle" (knows each window's load) or "oracle-burst-blind" (knows it but for
    # the bursts, on a load that says where they are; ``insured_share`` below).
    policy: str
    total_gpus: int = 200
    node_gpus: int = 8
    per_gpu_rps: float = 25.0
    headroom: float = 0.05
    lead_s: float = 600.0  # one window: reclaiming with a checkpoint fits inside it
    forecast_quantile: float = 0.99
    lend_horizon_s: float = 2 * 3600.0
    lend_quantile: float = 0.85  # lend what the load will likely not want back in that time
    cooldown_s: float = 3600.0
    min_inference_gpus: int = 8
    restart_overhead_s: float = 300.0  # a restarted gang's start-up, GPU time without progress
    checkpoint_write_s: float = 60.0  # time for a gang to write its checkpoint on notice
    grace_s: float = 300.0  # how long the broker waits for that checkpoint
    # Scale the forecast's upper bound online to meet this SLO (None: uncalibrated).
    slo_target: float | None = 0.995
    slo_step: float = 0.05  # the calibration's step per window (``SloCalibration.step``)
    elastic: bool = True  # shrink elastic gangs instead of stopping them (False: all rigid)
    # Scale the lend horizon's bound online to spend this share of training GPU-time on
    # preemptions (None: a fixed lend bound): under budget lend more, over it less.
    lost_work_budget: float | None = 0.01
    lost_work_low: float = -0.25  # under budget the lend bound shrinks to exp(-0.25) = 0.78x
    lost_work_high: float = 0.0  # over budget: the fixed bound (> 0: a brake, holding more)
    # The budget counts the work lost and done over this past span, as the running
    # broker reads it from the ledger (None: since the start of the trace).
    lost_work_window_s: float | None = 7 * 86400.0
    # "gpus": gangs and inference counted in GPUs; "nodes": placed on nodes
    # (``tideflow.broker.nodes``), so fragmentation can keep a gang waiting and make
    # inference's growth stop more gangs than the policy chose.
    placement: str = "gpus"
    # With placement "nodes": the policy sees each gang's nodes and the empty ones, and
    # chooses victims that empty whole nodes (False: victims chosen by count).
    node_aware: bool = True
    # The burst-blind bound holds room for a burst in this share of the windows, the
    # ones of least load (where that room costs least), and none elsewhere.
    insured_share: float = 0.5
    # The room it holds in those windows, as a multiple of the calm load (None: the
    # load's burst factor, room for a whole burst).
    burst_room: float | None = None
    # The hindsight bounds: the regression's quantile, and the room held over it (their
    # bound scaled by this, as tidal's calibration scales its forecast's).
    hindsight_quantile: float = 0.995
    hindsight_room: float = 1.0
    # What the "oracle" and "oracle-hindsight[-cross]" bounds keep of tidal besides its
    # next-window forecast, to tell what tidal loses to its forecast from what it loses
    # to its mechanics: "lean" (neither: no cooldown, a lend bound read from their own
    # bounds ahead), "cooldown" (tidal's cooldown between lends), "lend" (tidal's lend
    # bound, with its lost-work budget, which sees only the past) or "tidal" (both).
    bound_mechanics: str = "lean"

    def __post_init__(self) -> None:
        if self.placement not in ("gpus", "nodes"):
            raise ValueError(
                f"placement {self.placement!r}: use 'gpus' (counted) or 'nodes' (placed)"
            )
        if self.placement == "nodes" and self.total_gpus % self.node_gpus:
            raise ValueError(
                f"placement 'nodes': total_gpus {self.total_gpus} is not whole nodes of "
                f"{self.node_gpus}"
            )
        if self.burst_room is not None and not self.burst_room >= 1:
            raise ValueError(
                f"burst_room must be at least 1, the calm load, or None for the load's "
                f"burst factor (got {self.burst_room})"
            )
        if not self.hindsight_room > 0:
            raise ValueError(f"hindsight_room must be > 0 (got {self.hindsight_room})")
        if self.bound_mechanics not in MECHANICS:
            raise ValueError(
                f"bound_mechanics {self.bound_mechanics!r}: use one of "
                + ", ".join(repr(m) for m in MECHANICS)
                + " (what the oracle and hindsight bounds keep of tidal's mechanics)"
            )
        if self.bound_mechanics != "lean" and self.policy not in FORECAST_BOUNDS:
            raise ValueError(
                f"bound_mechanics {self.bound_mechanics!r} applies to the policies "
                + ", ".join(repr(p) for p in FORECAST_BOUNDS)
                + f" only (got policy {self.policy!r})"
            )

    @property
    def bound_keeps_cooldown(self) -> bool:
        """Whether a bound waits out tidal's cooldown between lends (policies always do)."""
        return self.bound_mechanics in ("cooldown", "tidal")

    @property
    def tidal_lend_bound(self) -> bool:
        """Whether the lend bound is tidal's (from the past, spending the budget)."""
        return self.policy == "tidal" or (
            self.policy in FORECAST_BOUNDS and self.bound_mechanics in ("lend", "tidal")
        )

    def static_gpus(self) -> int | None:
        if self.policy in ("tidal", *BOUNDS) or self.cron_headroom() is not None:
            return None
        kind, _, value = self.policy.partition(":")
        if kind != "static" or not value.isdigit():
            raise ValueError(
                f"policy {self.policy!r}: use 'tidal', 'static:N' (N GPUs for inference), "
                "'cron:H' (an hour-of-day schedule with headroom H, e.g. cron:0.2), "
                "'oracle' (a bound that knows each window's load), 'oracle-burst-blind' "
                "(a bound that knows it but for the bursts) or 'oracle-hindsight[-cross]' "
                "(a forecast fitted to the trace itself, or to its other half)"
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


@dataclass
class _Job:
    spec: JobSpec
    progress_s: float = 0.0
    committed_s: float = 0.0
    first_start_s: float | None = None
    finished_s: float | None = None
    running: bool = False
    startup_left_s: float = 0.0
    started_once: bool = False
    preemptions: int = 0
    gpus_now: int = 0  # GPUs it runs on (below spec.gpus while shrunk)
    # Time spent queued, the waits after its preemptions included: the first wait alone
    # would flatter a policy that stops gangs more often.
    queued_s: float = 0.0
    queued_since: float | None = None  # while queued: since when

    @property
    def speed(self) -> float:
        """Progress (seconds of full-size work) per second of running."""
        return self.gpus_now / self.spec.gpus


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


def _checkpoint_on_notice(job: _Job, config: SimulationConfig) -> float:
    """GPU-seconds lost when a running gang is told to stop: the checkpoint it writes if
    the grace allows (nothing to redo then), else its work since the last checkpoint."""
    lost = 0.0
    if job.startup_left_s <= 0 and config.checkpoint_write_s <= config.grace_s:
        job.committed_s = job.progress_s  # checkpoint-before-evict: nothing to redo
        lost += config.checkpoint_write_s * job.gpus_now
    lost += (job.progress_s - job.committed_s) * job.spec.gpus
    job.progress_s = job.committed_s
    return lost


def _at_risk(job: _Job, config: SimulationConfig) -> float:
    """GPU-seconds a stop of this gang would cost now (what emptying its node weighs)."""
    return (job.progress_s - job.committed_s) * job.spec.gpus + config.restart_overhead_s * (
        job.gpus_now
    )


def _preempt(job: _Job, config: SimulationConfig) -> float:
    """Stop a running gang; GPU-seconds of work lost."""
    lost = _checkpoint_on_notice(job, config)
    job.running = False
    job.preemptions += 1
    return lost


def _resize(job: _Job, gpus: int, config: SimulationConfig) -> float:
    """Restart a running elastic gang on ``gpus`` GPUs; GPU-seconds lost."""
    lost = _checkpoint_on_notice(job, config)
    job.gpus_now = gpus
    job.startup_left_s = config.restart_overhead_s
    return lost + config.restart_overhead_s * gpus


def simulate(  # noqa: PLR0915 - one readable event loop
    load: LoadSource,
    jobs: list[JobSpec],
    config: SimulationConfig,
    *,
    start_s: float | None = None,
    end_s: float | None = None,
) -> SimulationResult:
    """Replay ``load`` over [start_s, end_s); a trace's own bounds are the default."""
    static = config.static_gpus()
    policy_config = config.policy_config() if static is None else None
    step = load.window_s
    start = start_s if start_s is not None else getattr(load, "start_s", None)
    end = end_s if end_s is not None else getattr(load, "end_s", None)
    if start is None or end is None or end <= start:
        raise ValueError(
            "simulate: give start_s < end_s for a load without its own bounds "
            f"(got {start!r}, {end!r})"
        )
    raw: list[LoadSample] = load.samples(start, end)
    # What the broker sees: outage windows become gaps (judged on the past only).
    samples = clean_outages(raw)
    forecaster = LoadForecaster(step, quantile=config.forecast_quantile)
    blind = config.policy == "oracle-burst-blind"
    base, plan = (
        burst_blind_plan(load, raw, config.insured_share, config.burst_room) if blind else ([], [])
    )
    hindsight = config.policy.startswith("oracle-hindsight")
    fitted = (
        hindsight_bounds(
            samples,
            step,
            config.hindsight_quantile,
            cross_fitted=config.policy.endswith("-cross"),
        )
        if hindsight
        else []
    )
    lend_windows = max(1, math.ceil(config.lend_horizon_s / step))
    cron_headroom = config.cron_headroom()
    cron = CronSchedule(headroom=cron_headroom) if cron_headroom is not None else None
    calibration = (
        SloCalibration(config.slo_target, step=config.slo_step)
        # a static split and a cron's headroom are fixed (no promise to print); the
        # burst-blind bound's insured share is its own
        if (
            config.slo_target is not None
            and static is None
            and cron is None
            and not blind
            and not hindsight
        )
        else None
    )
    margin = 0.0
    saturated = 0  # windows whose miss the margin could not answer (at its ceiling)
    budget = (
        LostWorkBudget.for_cluster(
            config.lost_work_budget,
            config.total_gpus,
            low=config.lost_work_low,
            high=config.lost_work_high,
        )
        if config.lost_work_budget is not None and config.tidal_lend_bound
        else None
    )
    budget_saturated = 0  # windows over the lost-work budget (lending at the fixed bound)
    pending = sorted(jobs, key=lambda j: (j.submit_s, j.job_id))
    queue: list[_Job] = []  # submitted, not running, in submission order
    running: list[_Job] = []
    everyone: list[_Job] = []
    # A broker starts at half its ceiling, in whole nodes as it always holds them.
    inference = (
        static
        if static is not None
        else policy_config.ceiling // 2 // config.node_gpus * config.node_gpus  # type: ignore[union-attr]
    )
    pool = (
        NodePool(config.total_gpus // config.node_gpus, config.node_gpus)
        if config.placement == "nodes"
        else None
    )
    if pool is not None:
        inference = pool.inference_to(inference)
    placement_preemptions = 0  # stopped to empty whole nodes beyond the policy's victims
    last_lend: float | None = None
    lost_gpu_s = 0.0
    preemptions = shrinks = 0
    windows: list[Window] = []
    busy: list[float] = []  # training GPU-seconds of progress per window
    lost_by_window: list[float] = []  # GPU-seconds lost, per window (for the budget's span)
    budget_windows = (
        len(samples)
        if config.lost_work_window_s is None
        else max(1, round(config.lost_work_window_s / step))
    )
    forecast_errors: list[float] = []

    for index, sample in enumerate(samples):
        now = sample.start_s
        lost_before = lost_gpu_s
        while pending and pending[0].submit_s < now + step:
            job = _Job(pending.pop(0))
            job.queued_since = job.spec.submit_s
            queue.append(job)
            everyone.append(job)
        action, reason, upper, preempted_now = "static", "", None, 0
        if policy_config is not None:
            history = samples[max(0, index - int(HISTORY_S / step)) : index]
            measured = windows[-1] if windows else None
            if calibration is not None and measured is not None and measured.needed is not None:
                # The last window's outcome is known now (its load has been measured).
                covered = measured.inference_gpus >= measured.needed
                saturated += calibration.saturated(margin, covered)
                margin = calibration.next(margin, covered)
            if cron is not None:
                # Its own schedule is no forecast: it may look past the lead at what it
                # will ask for over the lend horizon.
                forecast = cron.forecast(history, now, policy_config.lead_s)
                lend_forecast = cron.forecast(history, now, policy_config.lend_horizon_s)
            else:
                forecast = scaled(forecaster.forecast(history, now, policy_config.lead_s), margin)
                lend_forecast = forecaster.forecast(
                    history, now, policy_config.lend_horizon_s, policy_config.lend_quantile
                )
                if budget is not None:  # the work lost and done so far is known now
                    trained = sum(busy[-budget_windows:])
                    lost = sum(lost_by_window[-budget_windows:])
                    budget_saturated += budget.saturated(lost, trained)
                    lend_forecast = scaled(lend_forecast, budget.margin(lost, trained))
            own_bound = config.policy == "oracle" or blind
            if config.policy == "oracle":
                # Not a policy: the same decisions fed each window's true load (lean: with
                # no cooldown and its lend bound the load itself), to bound what any
                # forecast could achieve on this trace.
                exact = Forecast(sample.rate, sample.rate, sample.rate, "oracle")
                forecast = exact
                if not config.tidal_lend_bound:
                    lend_forecast = exact
            elif blind:
                # A tighter bound: each window's load known but for its burst, room for
                # a burst held by plan, no cooldown (it knows the future's load).
                ahead = [p for p in plan[index : index + lend_windows] if p is not None]
                top = max(ahead) if ahead else None
                forecast = Forecast(base[index], plan[index], plan[index], "burst-blind")
                lend_forecast = Forecast(base[index], top, top, "burst-blind")
            elif hindsight and (own := fitted[index]) is not None:
                # A forecast fitted to the trace (the first windows, with nothing to fit
                # on, keep tidal's); lean, its lend bound is its own bounds over the lend
                # horizon, which read loads not yet seen: optimistic on purpose.
                own_bound = True
                room = config.hindsight_room
                ahead = [b for b in fitted[index : index + lend_windows] if b is not None]
                bound = own * room
                forecast = Forecast(None, bound, bound, "hindsight")
                if not config.tidal_lend_bound:
                    lend_forecast = Forecast(
                        None, max(ahead) * room, max(ahead) * room, "hindsight"
                    )
            if own_bound and not config.bound_keeps_cooldown:
                last_lend = None  # a bound that knows the load ahead needs no cooldown
            upper = forecast.upper
            if forecast.point is not None and sample.rate is not None:
                forecast_errors.append(abs(forecast.point - sample.rate) / sample.rate)
            held = sum(j.gpus_now for j in running)
            snapshot = Snapshot(
                now_s=now,
                inference_gpus=inference,
                measured_rps=(
                    sample.rate
                    if config.policy == "oracle"
                    else base[index]
                    if blind
                    else samples[index - 1].rate
                    if index
                    else None
                ),
                forecast=forecast,
                idle_training_gpus=config.total_gpus - inference - held,
                gangs=tuple(
                    GangView(
                        j.spec.job_id,
                        j.gpus_now,
                        j.spec.priority,
                        now - (j.progress_s - j.committed_s) / j.speed,
                        j.spec.min_gpus if config.elastic else None,
                        tuple(str(n) for n in pool.placed[j.spec.job_id]) if pool else (),
                    )
                    for j in running
                ),
                last_lend_s=last_lend,
                lend_forecast=lend_forecast,
                empty_nodes=len(pool.empty()) if pool and config.node_aware else None,
            )
            decision = decide(snapshot, policy_config)
            action, reason = str(decision.action), decision.reason
            by_id = {j.spec.job_id: j for j in running}
            for reclaim in decision.reclaims:
                victim = by_id[reclaim.gang_id]
                if not reclaim.evicted:
                    lost_gpu_s += _resize(victim, victim.gpus_now - reclaim.gpus, config)
                    if pool is not None:
                        pool.resize(victim.spec.job_id, victim.gpus_now)
                    shrinks += 1
                    continue
                lost_gpu_s += _preempt(victim, config)
                running.remove(victim)
                queue.append(victim)
                victim.queued_since = now
                preempted_now += 1
                if pool is not None:
                    pool.release(victim.spec.job_id)
            if pool is None:
                inference = decision.inference_gpus
            else:
                # The victims were chosen by count: empty whole nodes for the rest.
                grow = decision.inference_gpus // config.node_gpus - len(pool.inference)
                by_id = {j.spec.job_id: j for j in running}
                costs = {gang: _at_risk(j, config) for gang, j in by_id.items()}
                while grow > 0 and (extra := pool.to_empty(grow, costs)):
                    for gang in extra:
                        victim = by_id.pop(gang)
                        lost_gpu_s += _preempt(victim, config)
                        running.remove(victim)
                        queue.append(victim)
                        victim.queued_since = now
                        pool.release(gang)
                        preempted_now += 1
                        placement_preemptions += 1
                inference = pool.inference_to(decision.inference_gpus)
            queue.sort(key=lambda j: (j.spec.submit_s, j.spec.job_id))
            if decision.action is Action.LEND:
                last_lend = now
        preemptions += preempted_now

        # Start queued gangs that fit whole, in submission order (backfill smaller ones).
        free = config.total_gpus - inference - sum(j.gpus_now for j in running)
        for job in list(queue):
            fits = (
                job.spec.gpus <= free
                if pool is None
                else pool.place(job.spec.job_id, job.spec.gpus)
            )
            if fits:
                queue.remove(job)
                running.append(job)
                free -= job.spec.gpus
                job.gpus_now = job.spec.gpus
                job.running = True
                if job.first_start_s is None:
                    job.first_start_s = now
                if job.queued_since is not None:
                    job.queued_s += now - job.queued_since
                    job.queued_since = None
                job.startup_left_s = config.restart_overhead_s
                if job.started_once:  # start-up after a preemption is lost GPU time
                    lost_gpu_s += config.restart_overhead_s * job.spec.gpus
                job.started_once = True

        # Shrunk gangs grow back into what the queue left free.
        for job in running:
            if job.gpus_now < job.spec.gpus <= free + job.gpus_now and (
                pool is None or pool.resize(job.spec.job_id, job.spec.gpus)
            ):
                free -= job.spec.gpus - job.gpus_now
                lost_gpu_s += _resize(job, job.spec.gpus, config)

        # Advance the running gangs through the window.
        busy_gpu_s = 0.0
        for job in list(running):
            available = step
            warmup = min(job.startup_left_s, available)
            job.startup_left_s -= warmup
            available -= warmup
            remaining = job.spec.work_s - job.progress_s
            used = min(available * job.speed, remaining)  # full-size seconds of work
            job.progress_s += used
            busy_gpu_s += used * job.spec.gpus
            if job.progress_s >= job.spec.work_s - 1e-9:
                job.finished_s = now + warmup + used / job.speed
                job.committed_s = job.progress_s = job.spec.work_s
                job.running = False
                running.remove(job)
                if pool is not None:
                    pool.release(job.spec.job_id)
            else:
                every = job.spec.checkpoint_every_s
                job.committed_s = math.floor(job.progress_s / every) * every

        needed = math.ceil(sample.rate / config.per_gpu_rps - 1e-9) if sample.rate else None
        windows.append(
            Window(
                start_s=now,
                rate=sample.rate,
                forecast_upper=upper,
                needed=needed,
                inference_gpus=inference,
                training_gpus=sum(j.gpus_now for j in running),
                preempted=preempted_now,
                action=action,
                reason=reason,
            )
        )
        busy.append(busy_gpu_s)
        lost_by_window.append(lost_gpu_s - lost_before)

    metrics = _score(windows, busy, everyone, config, lost_gpu_s, preemptions, forecast_errors, end)
    metrics["shrinks"] = shrinks
    if pool is not None:
        metrics["placement_preemptions"] = placement_preemptions
    if calibration is not None:
        scored = metrics["windows"] - metrics["gap_windows"]
        promised = max(0.0, 1 - calibration.promised_misses(scored) / max(1, scored))
        metrics["slo_promised"] = round(promised, 5)  # void if any window was saturated
        metrics["calibration_saturated_windows"] = saturated
    if budget is not None:
        metrics["lost_work_budget_gpu_hours"] = round(
            budget.lends_beyond_the_bound_under(sum(busy)) / 3600, 1
        )
        metrics["lost_work_over_budget_windows"] = budget_saturated
    return SimulationResult(config, metrics, windows)


def _score(  # noqa: PLR0917 - private, called once
    windows: list[Window],
    busy: list[float],
    jobs: list[_Job],
    config: SimulationConfig,
    lost_gpu_s: float,
    preemptions: int,
    forecast_errors: list[float],
    end_s: float,
) -> dict[str, Any]:
    step = windows[1].start_s - windows[0].start_s if len(windows) > 1 else 600.0
    # data gaps have no known need: they are not scored
    scored = [(w.needed, w.inference_gpus) for w in windows if w.needed is not None]
    short = [max(0, need - alloc) for need, alloc in scored]
    serving = sum(min(need, alloc) * step for need, alloc in scored)
    goodput_s = sum(j.committed_s * j.spec.gpus for j in jobs)
    started = [j for j in jobs if j.first_start_s is not None]
    finished = [(j.finished_s, j.spec.submit_s) for j in jobs if j.finished_s is not None]
    waits = [
        (j.first_start_s if j.first_start_s is not None else end_s) - j.spec.submit_s for j in jobs
    ]
    queued = [
        j.queued_s + (end_s - j.queued_since if j.queued_since is not None else 0.0) for j in jobs
    ]
    return {
        "windows": len(windows),
        "gap_windows": len(windows) - len(scored),
        "per_gpu_rps": config.per_gpu_rps,
        "training_goodput_gpu_hours": round(goodput_s / 3600, 1),
        "underprovisioned_gpu_minutes": round(sum(short) * step / 60, 1),
        "slo_attainment": round(sum(1 for s in short if s == 0) / len(scored), 5)
        if scored
        else None,
        "preemptions": preemptions,
        "lost_gpu_hours": round(lost_gpu_s / 3600, 2),
        "lost_fraction_of_training": round(lost_gpu_s / max(1.0, sum(busy)), 5),
        "mean_gpu_utilization": round(
            (serving + sum(busy)) / (config.total_gpus * step * len(windows)), 4
        ),
        "mean_inference_gpus": round(statistics.fmean(w.inference_gpus for w in windows), 1),
        "forecast_mape": round(statistics.fmean(forecast_errors), 4) if forecast_errors else None,
        "jobs_submitted": len(jobs),
        "jobs_started": len(started),
        "jobs_finished": len(finished),
        # jobs never started count as waiting until the end (a lower bound on their wait)
        "mean_queueing_hours": round(statistics.fmean(waits) / 3600, 2) if waits else None,
        # every wait, the requeues after preemptions too (jobs still queued: until the end)
        "mean_total_queueing_hours": round(statistics.fmean(queued) / 3600, 2) if queued else None,
        "mean_jct_hours": round(
            statistics.fmean(done - submit for done, submit in finished) / 3600, 2
        )
        if finished
        else None,
    }
