"""Where a gang's workers go: a pure function of the request, the inventory and what is used.

Policy, in the order it is applied:
  * one model: a gang never mixes device models; without a model named, the
    model whose placement needs the fewest nodes wins (ties by name);
  * as few nodes as possible: while the rest of the gang does not fit on one
    node, take the node with the most free room (whole free nodes first);
  * best fit for the rest: the fullest node that still holds the remaining
    workers, so whole nodes stay free for the next big gang;
  * a worker's devices are the lowest free indices of its node;
  * an elastic gang (``min_workers`` below ``workers``) that does not fit whole
    starts with the most workers that fit now, down to its minimum, as Kueue's
    partial admission does; it never waits for its full size while a smaller
    one would run.

Nodes held for a reserved gang (``tideflow.scheduling.reservation``) are chosen
here too (``nodes_to_hold``), and a gang kept off them is placed as if they were
full (``without_nodes``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace

from tideflow.inventory import Inventory, Node
from tideflow.scheduling.model import DeviceClass, GangRequest, Refusal, WorkerPlacement


def _free(node: Node, request: GangRequest, model: str | None, used: set[int]) -> list[int]:
    total = node.offers(request.device_class, model)
    return [index for index in range(total) if index not in used]


def _plan_for_model(
    request: GangRequest,
    inventory: Inventory,
    model: str | None,
    used: Mapping[str, set[int]],
) -> list[tuple[Node, int]] | None:
    """(node, workers) choices for one model, or None if it does not fit now."""
    per = request.devices_per_worker
    room: dict[str, int] = {}
    free_count: dict[str, int] = {}
    nodes = {node.name: node for node in inventory.nodes}
    for node in inventory.nodes:
        free = _free(node, request, model, used.get(node.name, set()))
        if len(free) >= per:
            room[node.name] = len(free) // per
            free_count[node.name] = len(free)
    if sum(room.values()) < request.workers:
        return None
    remaining = request.workers
    chosen: list[tuple[Node, int]] = []
    while remaining > 0:
        fits_rest = [name for name, slots in room.items() if slots >= remaining]
        if fits_rest:
            name = min(fits_rest, key=lambda n: (free_count[n], n))
            chosen.append((nodes[name], remaining))
            return chosen
        name = max(room, key=lambda n: (room[n], -free_count[n], _reverse(n)))
        chosen.append((nodes[name], room[name]))
        remaining -= room.pop(name)
    return chosen


def _reverse(name: str) -> tuple[int, ...]:
    """Sort key that makes max() prefer the alphabetically first name on ties."""
    return tuple(-ord(ch) for ch in name)


def _summary(request: GangRequest, inventory: Inventory, used: Mapping[str, set[int]]) -> str:
    parts = []
    total_free = 0
    for model in [request.model] if request.model else inventory.models(request.device_class):
        counts: dict[int, int] = {}
        for node in inventory.nodes:
            if node.offers(request.device_class, model) == 0:
                continue
            free = len(_free(node, request, model, used.get(node.name, set())))
            total_free += free
            counts[free] = counts.get(free, 0) + 1
        label = request.device_class if model is None else f"{model}"
        described = ", ".join(
            f"{n} node(s) with {free} free" for free, n in sorted(counts.items(), reverse=True)
        )
        parts.append(f"{label}: {described or 'none'}")
    text = "; ".join(parts)
    if total_free >= request.devices:
        text += (
            f" ({total_free} free devices in total, but fragmented: no "
            f"{request.devices_per_worker} free on enough nodes)"
        )
    return text


def place(
    request: GangRequest, inventory: Inventory, used: Mapping[str, set[int]]
) -> tuple[WorkerPlacement, ...] | Refusal:
    whole = _place_exactly(request, inventory, used)
    if not isinstance(whole, Refusal) or not request.elastic or request.min_workers is None:
        return whole
    for workers in range(request.workers - 1, request.min_workers - 1, -1):
        smaller = _place_exactly(replace(request, workers=workers), inventory, used)
        if not isinstance(smaller, Refusal):
            return smaller
    # Not even the minimum fits: say so for the minimum (never, only if it never can).
    return _place_exactly(replace(request, workers=request.min_workers), inventory, used)


def _place_exactly(
    request: GangRequest, inventory: Inventory, used: Mapping[str, set[int]]
) -> tuple[WorkerPlacement, ...] | Refusal:
    label = request.label()
    wanted = f"{request.workers} worker(s) x {request.devices_per_worker} {label}"
    capacity = inventory.max_gang_workers(
        request.device_class, request.model, request.devices_per_worker
    )
    if capacity < request.workers:
        return Refusal(
            f"{wanted} can never be placed on cluster '{inventory.name}' "
            f"({inventory.describe(request.device_class, request.model)}; room for at most "
            f"{capacity} such worker(s) even when idle)",
            never=True,
        )
    models = [request.model] if request.model else inventory.models(request.device_class)
    best: tuple[str | None, list[tuple[Node, int]]] | None = None
    for model in models:
        plan = _plan_for_model(request, inventory, model, used)
        if plan is not None and (best is None or len(plan) < len(best[1])):
            best = (model, plan)
    if best is None:
        return Refusal(
            f"{wanted} do not fit now; free: {_summary(request, inventory, used)}", never=False
        )
    model, plan = best
    placements = []
    rank = 0
    for node, workers in plan:
        free = _free(node, request, model, used.get(node.name, set()))
        for slot in range(workers):
            start = slot * request.devices_per_worker
            devices = tuple(free[start : start + request.devices_per_worker])
            placements.append(WorkerPlacement(rank, node.name, devices))
            rank += 1
    return tuple(placements)


def nodes_to_hold(
    request: GangRequest,
    inventory: Inventory,
    used: Mapping[str, set[int]],
    *,
    newer: Mapping[str, int],
    leases: Mapping[str, int],
    taken: Collection[str] = (),
) -> tuple[str, ...]:
    """The nodes a reserved gang will occupy: where it can start soonest.

    Without run times, nodes rank by the devices ``newer`` leases hold there (those
    started since the reservation began: the held set stays put while it drains),
    then the most free devices, then the fewest ``leases`` to wait for, then name;
    the first ones with room for all its workers (their whole capacity, as if empty)
    are held. One model, as placement: without one named, the model whose nodes rank
    best. () when the nodes left (not ``taken`` by an earlier reservation) cannot
    hold it.
    """
    per = request.devices_per_worker
    best: tuple[tuple[int, int, int, tuple[str, ...]], tuple[str, ...]] | None = None
    models = [request.model] if request.model else inventory.models(request.device_class)
    for model in models:
        ranked = []
        for node in inventory.nodes:
            slots = node.offers(request.device_class, model) // per
            if slots == 0 or node.name in taken:
                continue
            free = len(_free(node, request, model, used.get(node.name, set())))
            rank = (newer.get(node.name, 0), -free, leases.get(node.name, 0), node.name)
            ranked.append((rank, slots))
        ranked.sort()
        chosen: list[tuple[int, int, int, str]] = []
        room = 0
        for rank, slots in ranked:
            if room >= request.workers:
                break
            chosen.append(rank)
            room += slots
        if room < request.workers:
            continue
        names = tuple(rank[3] for rank in chosen)
        score = (sum(r[0] for r in chosen), sum(r[1] for r in chosen), len(chosen), names)
        if best is None or score < best[0]:
            best = (score, names)
    return () if best is None else tuple(sorted(best[1]))


def without_nodes(
    inventory: Inventory,
    used: Mapping[str, set[int]],
    nodes: Collection[str],
    device_class: DeviceClass,
) -> dict[str, set[int]]:
    """``used`` with every device of ``nodes`` taken: what a gang kept off them sees."""
    fenced = {name: set(devices) for name, devices in used.items()}
    for node in inventory.nodes:
        if node.name in nodes:
            fenced[node.name] = set(range(node.offers(device_class, None)))
    return fenced
