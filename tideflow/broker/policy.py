"""The broker's policy: a pure function of (snapshot, config) -> decision.

No clock, no I/O: the same snapshot always gives the same decision, so every
decision can be replayed from its recorded snapshot and tested table-driven.

How many GPUs inference wants: enough for the forecast's upper bound over the
lead window at the per-GPU throughput, plus headroom, in whole nodes, within
[min, max]. Growing is never delayed (the SLO comes first); lending GPUs to
training needs a surplus of at least ``shrink_margin_gpus`` (hysteresis),
``cooldown_s`` since the last lend, and real measurements (never during a data
gap). When inference grows, idle training GPUs go first; then whole gangs
(or elastic gangs down to their minimum) are reclaimed, lowest priority
first and, within a priority, the one with the least work since its last
checkpoint; each is asked to checkpoint before it is evicted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from tideflow.broker.reclaims import Reclaim, node_stops, victims
from tideflow.broker.snapshot import GangView, Snapshot

__all__ = [
    "Action",
    "BrokerDecision",
    "GangView",
    "PolicyConfig",
    "Reclaim",
    "Snapshot",
    "decide",
    "gpus_for",
    "sizing",
]


@dataclass(frozen=True)
class PolicyConfig:
    total_gpus: int
    per_gpu_rps: float
    node_gpus: int = 8
    headroom: float = 0.05
    min_inference_gpus: int = 8
    max_inference_gpus: int | None = None
    lead_s: float = 600.0  # one 10-minute window: reclaiming with a checkpoint fits in it
    lend_horizon_s: float = 2 * 3600.0  # lent GPUs should stay lent at least this long
    lend_quantile: float = 0.85  # lend what the load will likely not want back in that time
    cooldown_s: float = 3600.0
    shrink_margin_gpus: int | None = None  # default: one node
    checkpoint_grace_s: float = 300.0
    # Spend training's unspent lost-work budget on lending (``calibrate.LostWorkBudget``;
    # None: the fixed lend bound). Read before the decision, not by it.
    lost_work_budget: float | None = 0.01
    stop_cost_s: float = 360.0  # per GPU stopped: the checkpoint on notice and the restart

    def __post_init__(self) -> None:
        problems = []
        if self.total_gpus <= 0:
            problems.append(f"total_gpus must be > 0 (got {self.total_gpus})")
        if self.per_gpu_rps <= 0:
            problems.append(f"per_gpu_rps must be > 0 (got {self.per_gpu_rps})")
        if self.node_gpus <= 0 or self.total_gpus % max(self.node_gpus, 1):
            problems.append(
                f"node_gpus must divide total_gpus ({self.total_gpus} % {self.node_gpus})"
            )
        if not 0 <= self.min_inference_gpus <= self.ceiling <= self.total_gpus:
            problems.append(
                "need 0 <= min_inference_gpus <= max_inference_gpus <= total_gpus "
                f"(got {self.min_inference_gpus}, {self.ceiling}, {self.total_gpus})"
            )
        if self.headroom < 0 or self.cooldown_s < 0 or self.lead_s < 0:
            problems.append("headroom, cooldown_s and lead_s must be >= 0")
        if self.lost_work_budget is not None and not 0 < self.lost_work_budget < 1:
            problems.append(
                f"lost_work_budget must be a share within (0, 1) or None "
                f"(got {self.lost_work_budget})"
            )
        if not self.stop_cost_s >= 0:
            problems.append(f"stop_cost_s must be >= 0 (got {self.stop_cost_s})")
        if problems:
            raise ValueError("broker policy: " + "; ".join(problems))

    @property
    def ceiling(self) -> int:
        return self.total_gpus if self.max_inference_gpus is None else self.max_inference_gpus

    @property
    def margin(self) -> int:
        return self.node_gpus if self.shrink_margin_gpus is None else self.shrink_margin_gpus


class Action(StrEnum):
    HOLD = "hold"
    GROW = "grow"  # training -> inference
    LEND = "lend"  # inference -> training


@dataclass(frozen=True)
class BrokerDecision:
    """What the broker decided for one step: inference's GPUs after it, and the gangs to reclaim."""

    action: Action
    inference_gpus: int  # allocation after the decision
    needed_now: int | None
    wanted: int | None
    emergency: bool = False
    reclaims: tuple[Reclaim, ...] = field(default=())
    reason: str = ""

    @property
    def moved(self) -> int:
        return sum(r.gpus for r in self.reclaims)


def gpus_for(rate: float, config: PolicyConfig) -> int:
    """GPUs that serve ``rate`` within the SLO (no headroom)."""
    return math.ceil(rate / config.per_gpu_rps - 1e-9)


def _whole_nodes_up(gpus: int, config: PolicyConfig) -> int:
    return math.ceil(gpus / config.node_gpus) * config.node_gpus


def sizing(decision: BrokerDecision, config: PolicyConfig) -> str:
    """The GPUs the load and forecast need (with headroom, before whole nodes), and what
    the policy takes when it rounds them up to whole nodes: "needs 3 GPU(s), takes 4:
    whole nodes of 4"."""
    needed, wanted = decision.needed_now, decision.wanted
    if needed is None and wanted is None:
        return "needs: unknown"
    floor_now = math.ceil(needed * (1 + config.headroom)) if needed is not None else 0
    need = max(wanted or 0, floor_now)
    takes = min(_whole_nodes_up(need, config), config.ceiling)
    why = f" (load and forecast with {config.headroom:.0%} headroom)" if config.headroom else ""
    if takes <= need:
        return f"needs {need} GPU(s){why}"
    return f"needs {need} GPU(s), takes {takes}: whole nodes of {config.node_gpus}{why}"


def decide(snapshot: Snapshot, config: PolicyConfig) -> BrokerDecision:
    current = snapshot.inference_gpus
    needed = gpus_for(snapshot.measured_rps, config) if snapshot.measured_rps is not None else None
    upper = snapshot.forecast.upper
    wanted = (
        math.ceil(upper / config.per_gpu_rps * (1 + config.headroom)) if upper is not None else None
    )
    if needed is None and wanted is None:
        return BrokerDecision(
            Action.HOLD, current, None, None, reason="no load data and no forecast: holding"
        )
    target = _target(needed, wanted, config)
    if target > current:
        return _grow(snapshot, config, needed, wanted, target)
    return _lend_or_hold(snapshot, config, needed, wanted, _lend_target(snapshot, config, target))


def _target(needed: int | None, wanted: int | None, config: PolicyConfig) -> int:
    """The GPUs inference should hold: the load now or the forecast, with headroom, in
    whole nodes within [min, max]."""
    floor_now = math.ceil(needed * (1 + config.headroom)) if needed is not None else 0
    target = max(wanted or 0, floor_now)
    return min(max(_whole_nodes_up(target, config), config.min_inference_gpus), config.ceiling)


def _freed_for_growth(
    snapshot: Snapshot, config: PolicyConfig, missing: int
) -> tuple[int, list[Reclaim], int]:
    """GPUs taken from idle training, the gangs reclaimed, and all GPUs that frees."""
    if snapshot.placed:
        # Inference takes whole empty nodes: idle GPUs spread over busy nodes are
        # of no use to it, and stopping gangs must empty whole nodes.
        empty = snapshot.empty_nodes or 0
        from_idle = min(missing, empty * config.node_gpus)
        short = -(-(missing - from_idle) // config.node_gpus)
        reclaims, emptied = node_stops(snapshot, short, config.node_gpus)
        return from_idle, reclaims, from_idle + emptied * config.node_gpus
    from_idle = min(missing, snapshot.idle_training_gpus)
    reclaims = victims(snapshot, missing - from_idle)
    return from_idle, reclaims, from_idle + sum(r.gpus for r in reclaims)


def _grow(
    snapshot: Snapshot, config: PolicyConfig, needed: int | None, wanted: int | None, target: int
) -> BrokerDecision:
    current = snapshot.inference_gpus
    upper = snapshot.forecast.upper
    emergency = needed is not None and needed > current
    missing = target - current
    from_idle, reclaims, freed = _freed_for_growth(snapshot, config, missing)
    after = current + min(freed, missing)
    why = (
        f"measured load needs {needed} GPUs but inference has {current}"
        if emergency
        else f"forecast peak {snapshot.forecast.peak:.0f} rps over the next "
        f"{config.lead_s / 60:.0f} min (upper {upper:.0f}) wants {target}"
    )
    evicted = [r.gang_id for r in reclaims]
    return BrokerDecision(
        Action.GROW,
        after,
        needed,
        wanted,
        emergency=emergency,
        reclaims=tuple(reclaims),
        reason=f"{why}: +{after - current} GPUs ({from_idle} idle"
        + (f", reclaiming {', '.join(evicted)} after a checkpoint" if evicted else "")
        + ")",
    )


def _lend_target(snapshot: Snapshot, config: PolicyConfig, target: int) -> int:
    if snapshot.lend_forecast is not None and snapshot.lend_forecast.upper is not None:
        # Lend only what the longer horizon does not want back soon: reclaiming a
        # gang an hour after lending it costs a restart.
        keep = math.ceil(snapshot.lend_forecast.upper / config.per_gpu_rps * (1 + config.headroom))
        target = min(max(target, _whole_nodes_up(keep, config)), config.ceiling)
    return target


def _lend_or_hold(
    snapshot: Snapshot, config: PolicyConfig, needed: int | None, wanted: int | None, target: int
) -> BrokerDecision:
    current = snapshot.inference_gpus
    surplus = current - target
    why_hold = _why_not_lend(snapshot, config, needed, surplus)
    if why_hold is not None:
        return BrokerDecision(Action.HOLD, current, needed, wanted, reason=why_hold)
    lend = (surplus // config.node_gpus) * config.node_gpus  # whole nodes only
    if lend == 0:
        return BrokerDecision(
            Action.HOLD, current, needed, wanted, reason="surplus is less than a whole node"
        )
    return BrokerDecision(
        Action.LEND,
        current - lend,
        needed,
        wanted,
        reason=f"forecast wants {target}; lending {lend} GPUs ({lend // config.node_gpus} "
        f"whole node(s)) to training",
    )


def _why_not_lend(
    snapshot: Snapshot, config: PolicyConfig, needed: int | None, surplus: int
) -> str | None:
    """Why a surplus is not lent (checked in this order), or None to lend it."""
    if surplus <= 0:
        return f"{snapshot.inference_gpus} GPUs fit the load"
    if needed is None:
        return "data gap in the measured load: not lending GPUs on a silent metric"
    if surplus < config.margin:
        return f"surplus {surplus} GPUs is under the {config.margin}-GPU margin"
    if (
        snapshot.last_lend_s is not None
        and snapshot.now_s - snapshot.last_lend_s < config.cooldown_s
    ):
        wait = config.cooldown_s - (snapshot.now_s - snapshot.last_lend_s)
        return f"cooling down: next lend in {wait:.0f} s"
    return None
