"""Teams' quotas, borrowing and priority preemption: pure functions of a snapshot.

The lease ledger asks two questions here, inside its transaction, and acts on
the answers; nothing in this module reads a clock or a database, so every
decision can be replayed from the snapshot it was made on.

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

``victims``: the gang fits its quota but the devices are held; whose gangs
may be stopped (after a checkpoint) to make room?
  * reclaim (the gang fits its team's nominal quota): borrowers of any team above
    its own nominal, whatever their priority (``tideflow.scheduling.reclaim``);
  * after a rule's ``auto_return_timeout``, a borrowing gang yields to any
    other team's gang, not only its lender's;
  * priority preemption (a class with ``preempts``): lower-priority gangs of
    the same team, and lower-priority gangs that borrow;
  * never: a gang another team runs within its own quota, a gang that is not
    preemptible, a team outside quotas.
The cheapest victims go first: lowest priority, then least work at risk
(time since its last checkpoint), then fewest devices; victims whose devices
turn out not to be needed are dropped again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, cast

from tideflow.scheduling import reclaim
from tideflow.scheduling.model import DeviceClass, GangRequest

if TYPE_CHECKING:
    from tideflow.inventory import ClusterSpec, Inventory
    from tideflow.spec.teams import BorrowingRule, Quota

SHARED_POOL = ""  # the lender of devices no team's nominal quota covers
DEFAULT_PREEMPTION_GRACE_S = 300.0

Key = tuple[str, str | None]  # (device class, model or None)


@dataclass(frozen=True)
class Held:
    """A lease as the quota policy sees it."""

    gang_id: str
    team: str
    device_class: str
    model: str | None  # the request's model (None: any)
    devices: int
    priority: int
    preemptible: bool
    acquired_at: float
    borrowed: int = 0  # devices beyond the team's nominal quota when it started
    lender: str | None = None  # SHARED_POOL or a team; None when nothing is borrowed
    work_at_risk_s: float = 0.0  # since its last checkpoint (or its start)
    evicting: bool = False  # already asked to stop


@dataclass(frozen=True)
class Grant:
    devices: int  # may be fewer than asked for an elastic gang (never below its minimum)
    borrowed: int
    lender: str | None

    @property
    def own(self) -> int:
        return self.devices - self.borrowed


@dataclass(frozen=True)
class QuotaWait:
    reason: str
    never: bool = False


@dataclass(frozen=True)
class Eviction:
    gang_id: str
    reason: str
    grace_s: float


class Teams:
    """The scheduler's view of a cluster file's teams (``tideflow.spec.teams``)."""

    def __init__(self, spec: ClusterSpec, inventory: Inventory) -> None:
        self.inventory = inventory
        self.classes = {c.name: c for c in spec.priority_classes}
        self.teams = {t.name: t for t in spec.teams}
        self.rules: dict[tuple[str, str], BorrowingRule] = {
            (r.lender, r.borrower): r for r in spec.borrowing
        }
        self.reserve_after_s = spec.scheduling.reserve_after
        self.fair_sharing = spec.scheduling.fair_sharing
        self.preemption_grace_s = DEFAULT_PREEMPTION_GRACE_S
        self._quotas: dict[tuple[str, Key], Quota] = {
            (t.name, q.key()): q for t in spec.teams for q in t.quota
        }

    @classmethod
    def of(cls, inventory: Inventory) -> Teams | None:
        return None if inventory.teams is None else cls(inventory.teams, inventory)

    # -- lookups ------------------------------------------------------------------------
    def governs(self, team: str) -> bool:
        return team in self.teams

    def key(self, team: str, device_class: str, model: str | None) -> Key:
        """The quota entry a gang counts against: its model's, else its device class's."""
        if model is not None and (team, (device_class, model)) in self._quotas:
            return (device_class, model)
        return (device_class, None)

    def quota(self, team: str, key: Key) -> Quota | None:
        return self._quotas.get((team, key))

    def nominal(self, team: str, key: Key) -> int:
        quota = self.quota(team, key)
        return 0 if quota is None else int(quota.nominal)

    def shared_pool(self, key: Key) -> int:
        """Devices of ``key`` that no team's nominal quota covers."""
        device_class, model = key
        total = sum(n.offers(cast(DeviceClass, device_class), model) for n in self.inventory.nodes)
        # A class-wide quota and the per-model ones draw on the same devices: count every
        # quota that could hold these (the smaller pool is the safe side).
        owned = sum(
            int(q.nominal)
            for (_, (cls, quota_model)), q in self._quotas.items()
            if cls == device_class and (model is None or quota_model in (None, model))
        )
        return max(0, total - owned)

    def priority(self, team: str, class_name: str | None) -> tuple[int, str | None]:
        """A gang's priority from its class (the team's default when none is named).

        ``ValueError`` names what the team may use when the class is unknown or not
        allowed; without a class at all the priority is 0 and no class applies.
        """
        declared = self.teams.get(team)
        name = class_name or (declared.default_priority_class if declared else None)
        if name is None:
            return 0, None
        if name not in self.classes:
            known = ", ".join(sorted(self.classes)) or "none declared"
            raise ValueError(f"unknown priority class '{name}'; declared: {known}")
        allowed = declared.priority_classes if declared else None
        if allowed is not None and name not in allowed:
            raise ValueError(
                f"team '{team}' may not use priority class '{name}'; it may use "
                f"{', '.join(allowed) or 'none'}"
            )
        return self.classes[name].value, name

    def preempts(self, request: GangRequest) -> bool:
        chosen = self.classes.get(request.priority_class or "")
        return chosen is not None and chosen.preempts

    def grace_s(self, victim: Held) -> float:
        rule = self.rules.get((victim.lender or "", victim.team))
        return float(rule.grace) if rule is not None else self.preemption_grace_s


# -- admission ------------------------------------------------------------------------
def _usage(teams: Teams, held: Sequence[Held], key: Key) -> tuple[dict[str, int], dict[str, int]]:
    """Devices each team uses on ``key``, and devices each lender has lent on it."""
    used: dict[str, int] = {}
    lent: dict[str, int] = {}
    for lease in held:
        if teams.key(lease.team, lease.device_class, lease.model) != key:
            continue
        used[lease.team] = used.get(lease.team, 0) + lease.devices
        if lease.lender is not None and lease.borrowed:
            lent[lease.lender] = lent.get(lease.lender, 0) + lease.borrowed
    return used, lent


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
            demand[request.team] = demand.get(request.team, 0) + _least(request)
    return demand


def _least(request: GangRequest) -> int:
    """The fewest devices the gang can start with (its minimum, for an elastic one)."""
    return (request.min_workers or request.workers) * request.devices_per_worker


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


def admit(
    teams: Teams,
    request: GangRequest,
    held: Sequence[Held],
    waiting: Sequence[GangRequest] = (),
) -> Grant | QuotaWait:
    """How many devices the team's quota grants ``request`` now, and on whose quota."""
    if not teams.governs(request.team):
        return Grant(request.devices, 0, None)
    key = teams.key(request.team, request.device_class, request.model)
    label = key[0] if key[1] is None else f"{key[1]} {key[0]}"
    quota = teams.quota(request.team, key)
    nominal = 0 if quota is None else quota.nominal
    used, lent = _usage(teams, held, key)
    lent_to = _lent_to(teams, request.team, key, held)
    borrowed_now = sum(lent_to.values())
    mine = used.get(request.team, 0)
    own_room = max(0, nominal - mine)
    least, most = _least(request), request.devices
    if most <= own_room:
        return Grant(most, 0, None)
    limit = None if quota is None else quota.borrowing_limit
    borrow_room = math.inf if limit is None else max(0, limit - borrowed_now)
    # what other teams' gangs waiting within their quota need: borrowing it feeds a reclaim
    unclaimed = reclaim.unclaimed_room(teams, request, key, used, waiting)
    lenders = [
        SHARED_POOL,
        *sorted(lender for (lender, borrower) in teams.rules if borrower == request.team),
    ]
    threshold_ok: dict[str, bool] = {}
    offers: list[tuple[int, str]] = []
    # the lenders' own waiting gangs (the only demand ``lendable`` reads)
    demand = _demand(teams, waiting, key, request.gang_id, of=frozenset(lenders[1:]))
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
    per = request.devices_per_worker
    for want in range(most, least - 1, -per):  # an elastic gang takes the most it can
        borrow = want - own_room
        if borrow > min(borrow_room, unclaimed):
            continue
        # the shared pool first (it is no team's idle quota), then the lender with the most idle
        for available, lender in sorted(offers, key=lambda o: (o[1] != SHARED_POOL, -o[0])):
            if available >= borrow:
                return Grant(want, borrow, lender)
    # Why not: what it has, what it may borrow, from whom.
    parts = [f"team {request.team} uses {mine} of its {nominal} {label} quota"]
    if limit is not None:
        parts.append(f"borrows {borrowed_now} of at most {limit}")
    if unclaimed < math.inf:
        parts.append(f"other teams' gangs waiting within their quota leave {unclaimed} to borrow")
    offered = ", ".join(
        f"{'the shared pool' if lender == SHARED_POOL else lender} {available}"
        for available, lender in offers
    )
    parts.append(f"could borrow now: {offered or 'nothing (no borrowing rule)'}")
    refused = [lender for lender, ok in threshold_ok.items() if not ok]
    if refused:
        parts.append(f"priority {request.priority} is below what {', '.join(refused)} lend(s) to")
    need = f"needs {least if least == most else f'{least}..{most}'} {label}"
    ceiling = nominal + min(
        borrow_room if limit is not None else math.inf,
        max(
            [teams.shared_pool(key)]
            + [_max_lend(teams, lender, request.team, key) for lender in lenders[1:]]
        ),
    )
    if least > ceiling:
        return QuotaWait(
            f"{need}, more than team {request.team} can ever get: its {nominal} {label} "
            f"quota plus at most {ceiling - nominal:.0f} borrowed",
            never=True,
        )
    return QuotaWait(f"{need}: " + "; ".join(parts))


def _max_lend(teams: Teams, lender: str, borrower: str, key: Key) -> int:
    rule = teams.rules.get((lender, borrower))
    quota = teams.quota(lender, key)
    if rule is None or quota is None:
        return 0
    limit = quota.nominal if quota.lending_limit is None else quota.lending_limit
    return int(min(limit, math.floor(rule.max_borrowable_ratio * quota.nominal)))


# -- eviction ---------------------------------------------------------------------------
def within_quota(teams: Teams, request: GangRequest, held: Sequence[Held]) -> bool:
    """Whether the gang fits its team's own nominal quota (it borrows nothing)."""
    key = teams.key(request.team, request.device_class, request.model)
    used, _ = _usage(teams, held, key)
    return used.get(request.team, 0) + _least(request) <= teams.nominal(request.team, key)


def candidates(
    teams: Teams, request: GangRequest, held: Sequence[Held], *, now: float
) -> list[tuple[Held, str]]:
    """The gangs ``request`` may stop, each with why, cheapest first ([] when it may
    stop none: the caller need not work out whether stopping them would help)."""
    if not teams.governs(request.team):
        return []
    key = teams.key(request.team, request.device_class, request.model)
    preempts = teams.preempts(request)
    # Reclaiming is for a team that wants its own quota back, not one that borrows too.
    over = reclaim.over_nominal(teams, held) if within_quota(teams, request, held) else None
    short = reclaim.free_quota(teams, key, _usage(teams, held, key)[0]) < _least(request)
    found: list[tuple[Held, str]] = []
    for lease in held:
        if lease.evicting or not lease.preemptible or lease.gang_id == request.gang_id:
            continue
        if lease.device_class != request.device_class or not teams.governs(lease.team):
            continue
        borrowing = lease.borrowed > 0 and lease.lender is not None
        why = None
        if borrowing and over:
            why = reclaim.reclaim_reason(teams, request, lease, over, short=short)
        if why is None and borrowing:
            why = reclaim.return_reason(teams, request, lease, now)
        if why is None and preempts and lease.priority < request.priority:
            if lease.team == request.team:
                why = f"preempted by {request.gang_id} (priority {request.priority})"
            elif borrowing:
                why = (
                    f"preempted by {request.gang_id} (priority {request.priority}): it "
                    f"borrows, and runs at priority {lease.priority}"
                )
        entry = teams.key(lease.team, lease.device_class, lease.model)
        if why is not None and (key[1] is None or entry == key):  # class-wide: any model
            found.append((lease, why))
    found.sort(key=lambda c: (c[0].priority, c[0].work_at_risk_s, c[0].devices))
    return found


def victims(
    teams: Teams,
    request: GangRequest,
    held: Sequence[Held],
    *,
    now: float,
    fits_without: Callable[[frozenset[str]], bool],
) -> tuple[Eviction, ...]:
    """The cheapest set of gangs whose stop lets ``request`` start, or () if none.

    ``fits_without(gang_ids)`` answers whether the request would be admitted
    (its quota, then placement, so fragmentation counts) were those gangs gone.
    """
    chosen: list[tuple[Held, str]] = []
    found = candidates(teams, request, held, now=now)
    for candidate in reclaim.bounded(teams, request, found, held):
        chosen.append(candidate)
        if fits_without(frozenset(h.gang_id for h, _ in chosen)):
            break
    else:
        return ()
    # Drop victims the placement turned out not to need (most expensive first).
    for candidate in sorted(chosen, key=lambda c: (-c[0].priority, -c[0].work_at_risk_s)):
        rest = [c for c in chosen if c is not candidate]
        if rest and fits_without(frozenset(h.gang_id for h, _ in rest)):
            chosen = rest
    return tuple(Eviction(h.gang_id, why, teams.grace_s(h)) for h, why in chosen)


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
            used, _ = _usage(teams, held, key)
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
