"""Teams' quotas and borrowing: pure functions of a snapshot.

The lease ledger asks here, inside its transaction, whether a gang may start
within its team's quota, and acts on the answer; nothing in this module reads a
clock or a database, so every decision can be replayed from the snapshot it was
made on.

``admit``: may this gang start within its team's quota, and how much of it is
borrowed and from whom?
  * a team first uses its own nominal quota for the device class (and model);
  * beyond it, it borrows: from the shared pool (devices no team's nominal
    covers), else from one lender whose rule allows it (``min_priority_class``,
    ``max_borrowable_ratio``), within the lender's ``lending_limit`` and the
    borrower's ``borrowing_limit``. A lender lends only what it neither uses
    nor waits for, and nobody borrows what other teams' gangs waiting within
    their quota need: a gang just reclaimed cannot borrow the devices back;
  * teams the file does not declare (the broker's inference reservations) are
    outside quotas.

``queue_order``: who goes first among the waiting gangs. Whose gangs may be
stopped to make room (``victims``) is ``tideflow.scheduling.preemption``'s;
the teams themselves are ``tideflow.scheduling.teams``'s. Both are importable
from here too.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from tideflow.scheduling import reclaim
from tideflow.scheduling.model import GangRequest, Refusal
from tideflow.scheduling.preemption import Eviction, candidates, victims, within_quota
from tideflow.scheduling.teams import (
    DEFAULT_PREEMPTION_GRACE_S,
    SHARED_POOL,
    Held,
    Key,
    Teams,
    least,
    usage,
)

# Why the quota does not admit a gang now (or ever): the same answer as placement's.
QuotaWait = Refusal


@dataclass(frozen=True)
class Grant:
    devices: int  # may be fewer than asked for an elastic gang (never below its minimum)
    borrowed: int
    lender: str | None

    @property
    def own(self) -> int:
        return self.devices - self.borrowed


def _demand(
    teams: Teams, waiting: Sequence[GangRequest], key: Key, exclude: str, of: Collection[str]
) -> dict[str, int]:
    """Devices the waiting gangs of the teams ``of`` ask for on ``key`` (a lender's own
    demand)."""
    demand: dict[str, int] = {}
    if not of:
        return demand
    for request in waiting:
        if request.team not in of or request.gang_id == exclude:
            continue
        if teams.key(request.team, request.device_class, request.model) == key:
            demand[request.team] = demand.get(request.team, 0) + least(request)
    return demand


def lendable(
    teams: Teams,
    *,
    lender: str,
    borrower: str,
    key: Key,
    used: Mapping[str, int],
    lent: Mapping[str, int],
    demand: Mapping[str, int],
    lent_to: Mapping[tuple[str, str], int],
) -> int:
    """What ``lender`` can lend ``borrower`` on ``key`` now (0 when no rule allows it)."""
    if lender == SHARED_POOL:
        return max(0, teams.shared_pool(key) - lent.get(SHARED_POOL, 0))
    rule = teams.rules.get((lender, borrower))
    quota = teams.quota(lender, key)
    if rule is None or quota is None:
        return 0
    own_use = min(used.get(lender, 0), quota.nominal)  # beyond nominal it borrows itself
    idle = quota.nominal - own_use - lent.get(lender, 0) - demand.get(lender, 0)
    limit = quota.nominal if quota.lending_limit is None else quota.lending_limit
    by_limit = limit - lent.get(lender, 0)
    by_ratio = math.floor(rule.max_borrowable_ratio * quota.nominal) - lent_to.get(
        (lender, borrower), 0
    )
    return int(max(0, min(idle, by_limit, by_ratio)))


def _lent_to(teams: Teams, team: str, key: Key, held: Sequence[Held]) -> dict[tuple[str, str], int]:
    """Devices ``team`` borrows on ``key`` now, per (lender, team)."""
    lent_to: dict[tuple[str, str], int] = {}
    for lease in held:
        if lease.lender is None or not lease.borrowed or lease.team != team:
            continue
        if teams.key(lease.team, lease.device_class, lease.model) == key:
            lent_to[(lease.lender, team)] = lent_to.get((lease.lender, team), 0) + lease.borrowed
    return lent_to


def _lenders(teams: Teams, team: str) -> list[str]:
    """Whom ``team`` may borrow from: the shared pool, then its lenders by name."""
    return [SHARED_POOL, *sorted(lender for (lender, borrower) in teams.rules if borrower == team)]


def _offers(
    teams: Teams,
    request: GangRequest,
    key: Key,
    *,
    used: Mapping[str, int],
    lent: Mapping[str, int],
    lent_to: Mapping[tuple[str, str], int],
    waiting: Sequence[GangRequest],
) -> tuple[list[tuple[int, str]], dict[str, bool]]:
    """What each lender can lend ``request`` on ``key`` now, and whether its priority
    is high enough for each lender whose rule names a ``min_priority_class``."""
    lenders = _lenders(teams, request.team)
    # the lenders' own waiting gangs (the only demand ``lendable`` reads)
    demand = _demand(teams, waiting, key, request.gang_id, of=frozenset(lenders[1:]))
    threshold_ok: dict[str, bool] = {}
    offers: list[tuple[int, str]] = []
    for lender in lenders:
        rule = teams.rules.get((lender, request.team))
        if rule is not None and rule.min_priority_class is not None:
            floor = teams.classes[rule.min_priority_class].value
            threshold_ok[lender] = request.priority >= floor
            if not threshold_ok[lender]:
                continue
        available = lendable(
            teams,
            lender=lender,
            borrower=request.team,
            key=key,
            used=used,
            lent=lent,
            demand=demand,
            lent_to=lent_to,
        )
        offers.append((available, lender))
    return offers, threshold_ok


def _largest(
    request: GangRequest, own_room: int, borrowable: float, offers: list[tuple[int, str]]
) -> Grant | None:
    """The most devices (down to an elastic gang's minimum) that its own room plus one
    offer covers, borrowing at most ``borrowable``."""
    for want in range(request.devices, least(request) - 1, -request.devices_per_worker):
        borrow = want - own_room
        if borrow > borrowable:
            continue
        # the shared pool first (it is no team's idle quota), then the lender with the most idle
        for available, lender in sorted(offers, key=lambda o: (o[1] != SHARED_POOL, -o[0])):
            if available >= borrow:
                return Grant(want, borrow, lender)
    return None


def admit(
    teams: Teams,
    request: GangRequest,
    held: Sequence[Held],
    waiting: Sequence[GangRequest] = (),
) -> Grant | Refusal:
    """How many devices the team's quota grants ``request`` now, and on whose quota."""
    if not teams.governs(request.team):
        return Grant(request.devices, 0, None)
    key = teams.key(request.team, request.device_class, request.model)
    quota = teams.quota(request.team, key)
    nominal = 0 if quota is None else quota.nominal
    used, lent = usage(teams, held, key)
    lent_to = _lent_to(teams, request.team, key, held)
    own_room = max(0, nominal - used.get(request.team, 0))
    if request.devices <= own_room:
        return Grant(request.devices, 0, None)
    limit = None if quota is None else quota.borrowing_limit
    borrowed_now = sum(lent_to.values())
    borrow_room = math.inf if limit is None else max(0, limit - borrowed_now)
    # what other teams' gangs waiting within their quota need: borrowing it feeds a reclaim
    unclaimed = reclaim.unclaimed_room(teams, request, key, used, waiting)
    offers, threshold_ok = _offers(
        teams, request, key, used=used, lent=lent, lent_to=lent_to, waiting=waiting
    )
    grant = _largest(request, own_room, min(borrow_room, unclaimed), offers)
    if grant is not None:
        return grant
    # Why not: what it has, what it may borrow, from whom.
    label = key[0] if key[1] is None else f"{key[1]} {key[0]}"
    why = [f"team {request.team} uses {used.get(request.team, 0)} of its {nominal} {label} quota"]
    if limit is not None:
        why.append(f"borrows {borrowed_now} of at most {limit}")
    if unclaimed < math.inf:
        why.append(f"other teams' gangs waiting within their quota leave {unclaimed} to borrow")
    offered = ", ".join(
        f"{'the shared pool' if lender == SHARED_POOL else lender} {available}"
        for available, lender in offers
    )
    why.append(f"could borrow now: {offered or 'nothing (no borrowing rule)'}")
    refused = [lender for lender, ok in threshold_ok.items() if not ok]
    if refused:
        why.append(f"priority {request.priority} is below what {', '.join(refused)} lend(s) to")
    return _refusal(teams, request, key, why, nominal=nominal, borrow_room=borrow_room)


def _refusal(
    teams: Teams,
    request: GangRequest,
    key: Key,
    why: list[str],
    *,
    nominal: int,
    borrow_room: float,
) -> Refusal:
    """Why not (``why``); never, when even all it could ever borrow is not enough."""
    label = key[0] if key[1] is None else f"{key[1]} {key[0]}"
    fewest, most = least(request), request.devices
    need = f"needs {fewest if fewest == most else f'{fewest}..{most}'} {label}"
    lenders = _lenders(teams, request.team)[1:]
    ceiling = nominal + min(
        borrow_room,  # math.inf without a borrowing_limit
        max(
            [teams.shared_pool(key)]
            + [_max_lend(teams, lender, request.team, key) for lender in lenders]
        ),
    )
    if fewest > ceiling:
        return Refusal(
            f"{need}, more than team {request.team} can ever get: its {nominal} {label} "
            f"quota plus at most {ceiling - nominal:.0f} borrowed",
            never=True,
        )
    return Refusal(f"{need}: " + "; ".join(why), never=False)


def _max_lend(teams: Teams, lender: str, borrower: str, key: Key) -> int:
    rule = teams.rules.get((lender, borrower))
    quota = teams.quota(lender, key)
    if rule is None or quota is None:
        return 0
    limit = quota.nominal if quota.lending_limit is None else quota.lending_limit
    return int(min(limit, math.floor(rule.max_borrowable_ratio * quota.nominal)))


def queue_order(
    teams: Teams | None, waiting: Sequence[tuple[GangRequest, float]], held: Sequence[Held]
) -> list[tuple[GangRequest, float]]:
    """Who goes first among waiters: priority, then (with fair sharing) the team using
    the smallest share of its nominal quota, then the earliest queued."""
    if teams is None or not teams.fair_sharing:
        return sorted(waiting, key=lambda w: (-w[0].priority, w[1]))
    shares: dict[tuple[str, Key], float] = {}

    def share(request: GangRequest) -> float:
        key = teams.key(request.team, request.device_class, request.model)
        if (request.team, key) not in shares:
            used, _ = usage(teams, held, key)
            nominal = teams.nominal(request.team, key)
            mine = used.get(request.team, 0)
            shares[(request.team, key)] = mine / nominal if nominal else (math.inf if mine else 0.0)
        return shares[(request.team, key)]

    return sorted(waiting, key=lambda w: (-w[0].priority, share(w[0]), w[1]))


def shrink_to(request: GangRequest, grant: Grant) -> GangRequest:
    """The request cut to the devices its quota grants (an elastic gang's smaller size)."""
    workers = grant.devices // request.devices_per_worker
    if workers >= request.workers:
        return request
    return replace(request, workers=workers)


__all__ = [
    "DEFAULT_PREEMPTION_GRACE_S",
    "SHARED_POOL",
    "Eviction",
    "Grant",
    "Held",
    "Key",
    "QuotaWait",
    "Teams",
    "admit",
    "candidates",
    "lendable",
    "queue_order",
    "shrink_to",
    "victims",
    "within_quota",
]
