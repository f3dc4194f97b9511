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
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from tideflow.broker.forecast import Forecast


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


@dataclass(frozen=True)
class GangView:
    """A training gang on the shared pool, as the policy sees it."""

    gang_id: str
    gpus: int
    priority: int = 0
    last_checkpoint_s: float = 0.0  # when its newest checkpoint was committed (or it started)
    min_gpus: int | None = None  # elastic lower bound; None = rigid
    nodes: tuple[str, ...] = ()  # the nodes it runs on, where the actuator knows them


@dataclass(frozen=True)
class Snapshot:
    now_s: float
    inference_gpus: int  # allocated to inference now
    measured_rps: float | None  # the last complete window; None = data gap
    forecast: Forecast
    idle_training_gpus: int  # training-pool GPUs no gang holds
    gangs: tuple[GangView, ...] = ()
    last_lend_s: float | None = None  # when inference last lent GPUs to training
    lend_forecast: Forecast | None = None  # over config.lend_horizon_s; None: use forecast
    # Training nodes no gang holds, where the actuator places gangs on nodes it names
    # (None: it does not; the policy counts GPUs).
    empty_nodes: int | None = None
    # Training nodes that also hold what the policy may not stop (a gang that is not
    # preemptible): stopping the gangs it sees there empties no node.
    pinned_nodes: frozenset[str] = frozenset()

    @property
    def placed(self) -> bool:
        """Whether growth must free whole nodes: the actuator names every gang's nodes."""
        return self.empty_nodes is not None and all(g.nodes for g in self.gangs)


class Action(StrEnum):
    HOLD = "hold"
    GROW = "grow"  # training -> inference
    LEND = "lend"  # inference -> training


@dataclass(frozen=True)
class Reclaim:
    gang_id: str
    gpus: int  # GPUs it gives back
    evicted: bool  # True: the whole gang stops; False: elastic shrink
    work_at_risk_s: float  # seconds of work since its last checkpoint


@dataclass(frozen=True)
class Decision:
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


def sizing(decision: Decision, config: PolicyConfig) -> str:
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


def _shrinks(gangs: tuple[GangView, ...], gpus: int) -> list[Reclaim]:
    """Elastic gangs shrunk towards their minimum for up to ``gpus`` GPUs, none stopped.

    Lowest priority first and, within a priority, the most spare GPUs first, so that
    as few gangs as possible pay a restart on the workers they keep.
    """
    out: list[Reclaim] = []
    order = sorted(gangs, key=lambda g: (g.priority, -(g.gpus - (g.min_gpus or g.gpus)), g.gang_id))
    for gang in order:
        spare = gang.gpus - (gang.min_gpus or gang.gpus)
        if gpus <= 0:
            break
        if spare > 0:
            out.append(Reclaim(gang.gang_id, min(spare, gpus), False, 0.0))
            gpus -= min(spare, gpus)
    return out


def _victims(snapshot: Snapshot, gpus: int) -> list[Reclaim]:
    """Gangs to reclaim for ``gpus`` GPUs, losing as little training as possible.

    Elastic gangs shrink first, together if one is not enough: each keeps
    running on its minimum (a restart, not a trip back to the queue). Only what
    the shrinks cannot give is taken by stopping whole gangs, chosen among the
    rest by priority (a higher-priority gang's GPUs count only when the lower
    ones cannot cover the need), then by the fewest GPUs stopped, since every
    stopped gang pays its start-up again on all of its GPUs: taking 8 GPUs
    from a 64-GPU gang costs eight times what taking them from an 8-GPU gang
    does. Ties go to the gang with the least work since its last checkpoint.
    """
    if gpus <= 0:
        return []
    shrinks = _shrinks(snapshot.gangs, gpus)
    gpus -= sum(r.gpus for r in shrinks)
    if gpus <= 0:
        return shrinks
    shrunk = {r.gang_id for r in shrinks}
    rest = tuple(g for g in snapshot.gangs if g.gang_id not in shrunk)
    stops = _stops(snapshot.now_s, rest, gpus)
    if sum(r.gpus for r in stops) < gpus:  # not enough without them: stop all, shrink none
        return _stops(snapshot.now_s, snapshot.gangs, gpus + sum(r.gpus for r in shrinks))
    return shrinks + stops


def _stop_costs(now_s: float, gangs: tuple[GangView, ...]) -> dict[str, tuple[float, ...]]:
    """What stopping each gang costs, compared tier by tier from the highest priority:
    the GPUs stopped in each priority, then the GPU-seconds of work since checkpoints."""
    tiers = sorted({g.priority for g in gangs}, reverse=True)
    return {
        g.gang_id: (
            *(float(g.gpus if g.priority == tier else 0) for tier in tiers),
            max(0.0, now_s - g.last_checkpoint_s) * g.gpus,
        )
        for g in gangs
    }


def _node_stops(snapshot: Snapshot, nodes: int, node_gpus: int) -> tuple[list[Reclaim], int]:
    """Whole gangs stopped so that ``nodes`` busy nodes become empty, and how many do.

    Two candidates, the cheaper kept (the first on a tie): the cheapest cover by count
    (``_stops``), which empties whole nodes when the gangs are whole nodes, and none;
    each is completed while too few nodes are empty (gangs smaller than a node,
    spread) by emptying the node whose remaining gangs cost least to stop (a gang
    spanning several nodes is stopped once and empties the others with it), then any
    victim not needed for the nodes emptied is spared, the costliest first. Elastic
    gangs are stopped too: a shrink frees GPUs where it leaves them, not whole nodes
    (on the local backend a stopped elastic gang resumes on what its next lease
    grants, down to its minimum).
    """
    if nodes <= 0:
        return [], 0
    costs = _stop_costs(snapshot.now_s, snapshot.gangs)
    on: dict[str, set[str]] = {}
    for view in snapshot.gangs:
        for node in view.nodes:
            if node not in snapshot.pinned_nodes:
                on.setdefault(node, set()).add(view.gang_id)

    def emptied(chosen: set[str]) -> int:
        return sum(1 for gangs in on.values() if gangs <= chosen)

    def completed(chosen: set[str]) -> set[str]:
        """``chosen`` plus the cheapest nodes' gangs until enough nodes are empty, less
        any victim the emptied nodes do not need (the costliest spared first)."""
        chosen = set(chosen)
        while emptied(chosen) < nodes:
            busy = [n for n, gangs in on.items() if not gangs <= chosen]
            if not busy:
                break
            _, cheapest = min((_summed(costs[g] for g in on[n] - chosen), n) for n in busy)
            chosen |= on[cheapest]
        enough = min(nodes, emptied(chosen))
        for gang in sorted(chosen, key=lambda g: (costs[g], g), reverse=True):
            if emptied(chosen - {gang}) >= enough:
                chosen.discard(gang)
        return chosen

    by_count = completed(
        {r.gang_id for r in _stops(snapshot.now_s, snapshot.gangs, nodes * node_gpus)}
    )
    by_node = completed(set())  # a node's idle GPUs make its gangs a cheaper cover

    def rank(chosen: set[str]) -> tuple[int, tuple[float, ...]]:
        return -emptied(chosen), _summed(costs[g] for g in chosen) if chosen else ()

    chosen = by_node if rank(by_node) < rank(by_count) else by_count
    views = {g.gang_id: g for g in snapshot.gangs}
    reclaims = [
        Reclaim(g.gang_id, g.gpus, True, max(0.0, snapshot.now_s - g.last_checkpoint_s))
        for g in sorted((views[x] for x in chosen), key=lambda g: (g.priority, g.gpus, g.gang_id))
    ]
    return reclaims, emptied(chosen)


def _summed(costs: Iterable[tuple[float, ...]]) -> tuple[float, ...]:
    return tuple(map(sum, zip(*costs, strict=True)))


def _stops(now_s: float, gangs: tuple[GangView, ...], gpus: int) -> list[Reclaim]:
    """Whole gangs stopped for ``gpus`` GPUs at the least cost (all of them if too few)."""
    costs = _stop_costs(now_s, gangs)

    def cost_of(gang: GangView) -> tuple[float, ...]:
        return costs[gang.gang_id]

    tiers = sorted({g.priority for g in gangs}, reverse=True)

    # Min-cost cover (a small knapsack): best[g] = cheapest set freeing >= g GPUs,
    # with g capped at the need. Costs compare tier by tier, highest priority first.
    best: list[tuple[tuple[float, ...], tuple[GangView, ...]] | None] = [None] * (gpus + 1)
    best[0] = ((0.0,) * (len(tiers) + 1), ())
    for gang in sorted(gangs, key=lambda g: g.gang_id):
        cost = cost_of(gang)
        for have in range(gpus, -1, -1):  # each gang at most once
            entry = best[have]
            if entry is None:
                continue
            reach = min(gpus, have + gang.gpus)
            total = tuple(x + y for x, y in zip(entry[0], cost, strict=True))
            current = best[reach]
            if current is None or total < current[0]:
                best[reach] = (total, (*entry[1], gang))
    found = best[gpus]
    chosen = found[1] if found is not None else tuple(gangs)  # not enough: all
    return [
        Reclaim(g.gang_id, g.gpus, True, max(0.0, now_s - g.last_checkpoint_s))
        for g in sorted(chosen, key=lambda g: (g.priority, g.gpus, g.gang_id))
    ]


def decide(snapshot: Snapshot, config: PolicyConfig) -> Decision:
    current = snapshot.inference_gpus
    needed = gpus_for(snapshot.measured_rps, config) if snapshot.measured_rps is not None else None
    upper = snapshot.forecast.upper
    wanted = (
        math.ceil(upper / config.per_gpu_rps * (1 + config.headroom)) if upper is not None else None
    )
    if needed is None and wanted is None:
        return Decision(
            Action.HOLD, current, None, None, reason="no load data and no forecast: holding"
        )
    floor_now = math.ceil(needed * (1 + config.headroom)) if needed is not None else 0
    target = max(wanted or 0, floor_now)
    target = min(max(_whole_nodes_up(target, config), config.min_inference_gpus), config.ceiling)
    emergency = needed is not None and needed > current

    if target > current:
        missing = target - current
        if snapshot.placed:
            # Inference takes whole empty nodes: idle GPUs spread over busy nodes are
            # of no use to it, and stopping gangs must empty whole nodes.
            empty = snapshot.empty_nodes or 0
            from_idle = min(missing, empty * config.node_gpus)
            short = -(-(missing - from_idle) // config.node_gpus)
            reclaims, emptied = _node_stops(snapshot, short, config.node_gpus)
            freed = from_idle + emptied * config.node_gpus
        else:
            from_idle = min(missing, snapshot.idle_training_gpus)
            reclaims = _victims(snapshot, missing - from_idle)
            freed = from_idle + sum(r.gpus for r in reclaims)
        after = current + min(freed, missing)
        why = (
            f"measured load needs {needed} GPUs but inference has {current}"
            if emergency
            else f"forecast peak {snapshot.forecast.peak:.0f} rps over the next "
            f"{config.lead_s / 60:.0f} min (upper {upper:.0f}) wants {target}"
        )
        evicted = [r.gang_id for r in reclaims]
        return Decision(
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

    if snapshot.lend_forecast is not None and snapshot.lend_forecast.upper is not None:
        # Lend only what the longer horizon does not want back soon: reclaiming a
        # gang an hour after lending it costs a restart.
        keep = math.ceil(snapshot.lend_forecast.upper / config.per_gpu_rps * (1 + config.headroom))
        target = min(max(target, _whole_nodes_up(keep, config)), config.ceiling)
    surplus = current - target
    if surplus <= 0:
        return Decision(Action.HOLD, current, needed, wanted, reason=f"{current} GPUs fit the load")
    if needed is None:
        return Decision(
            Action.HOLD,
            current,
            needed,
            wanted,
            reason="data gap in the measured load: not lending GPUs on a silent metric",
        )
    if surplus < config.margin:
        return Decision(
            Action.HOLD,
            current,
            needed,
            wanted,
            reason=f"surplus {surplus} GPUs is under the {config.margin}-GPU margin",
        )
    if (
        snapshot.last_lend_s is not None
        and snapshot.now_s - snapshot.last_lend_s < config.cooldown_s
    ):
        wait = config.cooldown_s - (snapshot.now_s - snapshot.last_lend_s)
        return Decision(
            Action.HOLD, current, needed, wanted, reason=f"cooling down: next lend in {wait:.0f} s"
        )
    lend = (surplus // config.node_gpus) * config.node_gpus  # whole nodes only
    if lend == 0:
        return Decision(
            Action.HOLD, current, needed, wanted, reason="surplus is less than a whole node"
        )
    return Decision(
        Action.LEND,
        current - lend,
        needed,
        wanted,
        reason=f"forecast wants {target}; lending {lend} GPUs ({lend // config.node_gpus} "
        f"whole node(s)) to training",
    )
