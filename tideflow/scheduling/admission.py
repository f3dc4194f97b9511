"""Admission: whether a gang starts now, as numbered steps over one snapshot.

Kueue's scheduler admits a workload in steps over a snapshot of its cache:
does it fit its ClusterQueue's quota, may it borrow, whom would it preempt,
then admit. The ledger's ``try_acquire`` does the same for one gang; every step
is a function of the snapshot (``tideflow.scheduling.snapshot``), the request
and the time, and ``decide`` returns one result, which the ledger writes:

  1. quota: the team's quota admits it, perhaps borrowing, perhaps fewer
     workers of an elastic gang (``quota.admit``); if not, it waits, and gangs
     that a preempting class or an expired borrow may stop are asked to (5);
  2. reservations: gangs that have waited past ``reserve_after`` hold nodes
     and quota (``reservation``); a gang behind one that would take the quota
     it needs waits;
  3. placement: it is placed off the nodes held for reserved gangs ahead of it
     (``placement.place``); a gang that never fits the inventory is refused;
  4. held nodes: a gang that fits only on held nodes waits for them;
  5. room: when it does not fit, the gangs whose stop would let it start are
     asked to stop (``evictions.make_room``); it waits for them;
  6. the queue: a waiter ahead of it (higher priority, with fair sharing a
     team using less of its quota, or queued earlier) that would also fit now
     goes first: best-effort FIFO, as Kueue's BestEffortFIFO, so waiters that
     do not fit do not block smaller gangs behind them;
  7. admit: the placements and the quota grant become its lease.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from tideflow.scheduling import evictions
from tideflow.scheduling.model import GangRequest, Lease, Refusal, WorkerPlacement
from tideflow.scheduling.placement import place, without_nodes
from tideflow.scheduling.preemption import Eviction
from tideflow.scheduling.quota import Grant, admit, queue_order, shrink_to
from tideflow.scheduling.reservation import Reservation, quota_held_back, reservations
from tideflow.scheduling.snapshot import LedgerSnapshot

WorkAtRisk = Callable[[Lease, float], float]


@dataclass(frozen=True)
class Admitted:
    """Step 7: where the gang's workers go, and its quota grant (None: no teams)."""

    placements: tuple[WorkerPlacement, ...]
    grant: Grant | None

    def lease(self, request: GangRequest, holder: str, now: float, ttl_s: float) -> Lease:
        grant, placed = self.grant, self.placements
        borrowed = grant.borrowed if grant is not None else 0
        return Lease(
            uuid.uuid4().hex,
            request.gang_id,
            holder,
            request.team,
            request.device_class,
            request.model,
            placed,
            request.priority,
            request.preemptible,
            now,
            now + ttl_s,
            request.min_workers if request.elastic else None,
            # an elastic gang placed on fewer devices than granted borrows less
            max(0, borrowed - (grant.devices - sum(len(p.devices) for p in placed)))
            if grant is not None
            else 0,
            grant.lender if grant is not None and borrowed else None,
            request.priority_class,
        )


@dataclass(frozen=True)
class Waits:
    """The gang does not start now: why, and what the ledger records for it."""

    reason: str  # its waiting reason (journaled when it changes), or why never
    never: bool = False  # it can never start: it leaves the queue
    journaled: bool = False  # a never the journal records ("refuse": the quota's)
    name_holders: bool = False  # the answer also names who holds its device class
    evictions: tuple[Eviction, ...] = ()  # gangs to ask to stop for it


def decide(
    snap: LedgerSnapshot, request: GangRequest, now: float, work_at_risk: WorkAtRisk
) -> Admitted | Waits:
    """Steps 1 to 7 for ``request`` on ``snap`` at ``now``."""
    grant: Grant | None = None
    wanted = request
    if snap.teams is not None:
        quota = admit(snap.teams, request, snap.held, snap.waiting)  # 1
        if not isinstance(quota, Grant):
            return _over_quota(snap, request, quota, now, work_at_risk)
        grant, wanted = quota, shrink_to(request, quota)
    used = snap.used(request.device_class)
    booked = [] if grant is None else _reservations(snap, request.device_class, used, now)  # 2
    placed = _place(snap, request, wanted, now, grant, booked, used, work_at_risk)  # 3, 4, 5
    if isinstance(placed, Waits):
        return placed
    ahead = _waiter_ahead(snap, request, used, now, booked)  # 6
    if ahead is not None:
        return Waits(
            f"fits now, but {ahead} waits ahead of it (higher priority, "
            + ("a team using less of its quota, " if snap.teams else "")
            + "or the same priority and queued earlier)"
        )
    return Admitted(placed, grant)  # 7


def _over_quota(
    snap: LedgerSnapshot, request: GangRequest, quota: Refusal, now: float, work_at_risk: WorkAtRisk
) -> Waits:
    """Step 1's refusal: never, or waiting (a preempting class, or an expired borrow,
    may free quota too)."""
    if quota.never:
        return Waits(quota.reason, never=True, journaled=True)
    evicting, chosen = evictions.make_room(snap, request, now, work_at_risk)
    return Waits(evicting or quota.reason, evictions=chosen)


def _reservations(
    snap: LedgerSnapshot, device_class: str, used: dict[str, set[int]], now: float
) -> list[Reservation]:
    """Step 2: the gangs that have waited past ``reserve_after`` on this class, and the
    nodes held for each (``tideflow.scheduling.reservation``)."""
    assert snap.teams is not None
    limit = snap.teams.reserve_after_s
    if limit is None or not any(at <= now - limit for at in snap.enqueued_at):
        return []
    return reservations(
        snap.teams,
        snap.inventory,
        device_class,
        waiting=list(zip(snap.waiting, snap.enqueued_at, strict=True)),
        held=snap.held,
        used=used,
        claims=snap.reservation_claims(device_class),
        now=now,
    )


def _place(  # noqa: PLR0917 (what the earlier steps found, handed on)
    snap: LedgerSnapshot,
    request: GangRequest,
    wanted: GangRequest,
    now: float,
    grant: Grant | None,
    booked: list[Reservation],
    used: dict[str, set[int]],
    work_at_risk: WorkAtRisk,
) -> tuple[WorkerPlacement, ...] | Waits:
    """Steps 2 to 5: where the gang goes, off the nodes held for reserved gangs ahead
    of it; or why it waits (and whom it asks to stop)."""
    held_nodes: frozenset[str] = frozenset()
    ahead: list[Reservation] = []
    if grant is not None and booked:
        queued_at = snap.queued_at(request, now)
        ahead = [r for r in booked if r.ahead_of(request, queued_at)]
        refusal = _held_back(snap, request, grant, ahead, now)
        if refusal is not None:
            return Waits(refusal)
        held_nodes = frozenset(node for r in ahead for node in r.nodes)
    fence = (
        without_nodes(snap.inventory, used, held_nodes, request.device_class)
        if held_nodes
        else used
    )
    placed = place(wanted, snap.inventory, fence)  # 3
    if not isinstance(placed, Refusal):
        return placed
    if placed.never:
        return Waits(placed.reason, never=True)
    if held_nodes:  # 4
        anywhere = place(wanted, snap.inventory, used)
        if not isinstance(anywhere, Refusal):
            return Waits(_on_held_nodes(snap, ahead, now))
        placed = anywhere  # it does not fit at all: say so with every node
    if snap.teams is not None:  # 5
        evicting, chosen = evictions.make_room(
            snap, request, now, work_at_risk, held_nodes=held_nodes
        )
        if evicting:
            return Waits(evicting, evictions=chosen)
    return Waits(placed.reason, name_holders=True)


def _held_back(
    snap: LedgerSnapshot, request: GangRequest, grant: Grant, ahead: list[Reservation], now: float
) -> str | None:
    """Why ``request`` may not start although its quota admits it: it would take
    quota that a reserved gang ahead of it needs."""
    assert snap.teams is not None
    if not ahead:
        return None
    blocked = quota_held_back(
        snap.teams, request, grant, ahead=ahead, held=snap.held, waiting=snap.waiting, now=now
    )
    if blocked is None:
        return None
    return (
        f"quota of class {request.device_class} is "
        f"{blocked.describe(now, snap.teams.reserve_after_s or 0)}: it would no longer be "
        "admitted with this gang running; gangs of its priority or lower start after it"
    )


def _on_held_nodes(snap: LedgerSnapshot, ahead: list[Reservation], now: float) -> str:
    assert snap.teams is not None
    limit = snap.teams.reserve_after_s or 0
    held = "; ".join(f"{', '.join(r.nodes)} {r.describe(now, limit)}" for r in ahead if r.nodes)
    return (
        f"fits only on nodes held for a gang ahead of it: {held}; "
        "gangs of its priority or lower start on the other nodes"
    )


def _waiter_ahead(
    snap: LedgerSnapshot,
    request: GangRequest,
    used: dict[str, set[int]],
    now: float,
    booked: list[Reservation],
) -> str | None:
    """Step 6: the first waiter queued ahead of ``request`` that would start now."""
    queued_at = now
    waiting: list[tuple[GangRequest, float]] = []
    for other, at in zip(snap.waiting, snap.enqueued_at, strict=True):
        if other.gang_id == request.gang_id:
            queued_at = at
        elif other.priority >= request.priority:
            waiting.append((other, at))
    if not waiting:
        return None
    # the asking gang first: on a tie it keeps its place (the sort is stable)
    for other, at in queue_order(snap.teams, [(request, queued_at), *waiting], snap.held):
        if other.gang_id == request.gang_id:
            return None  # everyone after it in the queue waits behind it
        if _would_start(snap, request, other, at, used, now, booked):
            return other.gang_id
    return None


def _would_start(  # noqa: PLR0917 (the waiter, and what step 6 read for the asking gang)
    snap: LedgerSnapshot,
    request: GangRequest,
    other: GangRequest,
    queued_at: float,
    used: dict[str, set[int]],
    now: float,
    booked: list[Reservation],
) -> bool:
    """Whether the waiter ``other`` would start now, were ``request`` not asking."""
    candidate, granted = other, None
    if snap.teams is not None:
        # as step 1 does: a lender's own waiting gangs are demand it does not lend
        quota = admit(snap.teams, other, snap.held, snap.waiting)
        if not isinstance(quota, Grant):
            return False
        candidate, granted = shrink_to(other, quota), quota
    other_used = (
        used if other.device_class == request.device_class else snap.used(other.device_class)
    )
    # A waiter that a reservation holds back (booked: on the asking gang's class) is
    # not about to start, or only off the held nodes.
    ahead = [r for r in booked if r.ahead_of(other, queued_at)]
    if ahead and granted is not None and other.device_class == request.device_class:
        if _held_back(snap, other, granted, ahead, now) is not None:
            return False
        fenced = {node for r in ahead for node in r.nodes}
        other_used = without_nodes(snap.inventory, other_used, fenced, other.device_class)
    return not isinstance(place(candidate, snap.inventory, other_used), Refusal)
