"""Which training gangs inference takes GPUs back from, losing as little work as possible.

Part of the broker policy (``tideflow.broker.policy``): pure functions of its snapshot,
no clock and no I/O. Elastic gangs shrink before whole gangs stop; where the actuator
places gangs on nodes, whole nodes are emptied instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tideflow.broker.snapshot import GangView, Snapshot


@dataclass(frozen=True)
class Reclaim:
    gang_id: str
    gpus: int  # GPUs it gives back
    evicted: bool  # True: the whole gang stops; False: elastic shrink
    work_at_risk_s: float  # seconds of work since its last checkpoint


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


def victims(snapshot: Snapshot, gpus: int) -> list[Reclaim]:
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


def node_stops(snapshot: Snapshot, nodes: int, node_gpus: int) -> tuple[list[Reclaim], int]:
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
