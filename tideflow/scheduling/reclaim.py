"""Reclaim as Kueue's ``reclaimWithinCohort`` decides it (pure, like ``quota``).

The compiled queues (``tideflow.compile.kueue_queues``) put every team in one
Cohort with ``reclaimWithinCohort: Any``. Kueue pools lending in the cohort: a
ClusterQueue whose workload fits within its own nominal quota may preempt the
workloads of any ClusterQueue using more than its nominal, and stops choosing a
queue's workloads once that queue is no longer above it. The ledger must decide
the same, or a team waits locally where Kueue would have given its quota back:

* a gang that fits within its team's nominal quota, when the cohort's free
  quota is short of it, reclaims borrowing gangs of any team that uses more
  than its own nominal quota on that entry, whatever their priority. A lender
  also reclaims its own borrowers when its gang only does not fit on the
  nodes: the ledger places gangs, Kueue admits quota and leaves placement to
  the scheduler;
* whose quota the ledger counted a borrow against (a lender, the shared pool)
  does not matter: devices are not tied to a lender, so a borrower may sit on
  another team's devices once its lender has taken its own quota back elsewhere.
  The attribution picks the grace (the borrower's rule's) and who may reclaim
  for placement;
* a team is never taken below its nominal quota by other teams' gangs: once the
  gangs already chosen bring it back to its nominal, the rest are its own;
* while a gang that fits within its team's nominal quota waits, other teams
  borrow only the quota it leaves (Kueue admits workloads within their nominal
  quota before any that borrow): else the gang reclaimed for it borrows the
  freed devices straight back, is reclaimed again, and so on without end.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tideflow.scheduling.model import GangRequest
    from tideflow.scheduling.teams import Held, Key, Teams

Entry = tuple[str, "Key"]  # (team, the quota entry its gangs count against)


def _entry(teams: Teams, lease: Held) -> Entry:
    return (lease.team, teams.key(lease.team, lease.device_class, lease.model))


def over_nominal(teams: Teams, held: Sequence[Held]) -> dict[Entry, int]:
    """Devices each team uses beyond its nominal quota, per quota entry: what Kueue
    counts as a ClusterQueue's borrowing, whichever lenders the leases name. A gang
    already asked to stop is giving its devices back: counting it would let a second
    reclaim take the team below its nominal."""
    used: dict[Entry, int] = {}
    for lease in held:
        if teams.governs(lease.team) and not lease.evicting:
            used[_entry(teams, lease)] = used.get(_entry(teams, lease), 0) + lease.devices
    beyond = {entry: n - teams.nominal(*entry) for entry, n in used.items()}
    return {entry: n for entry, n in beyond.items() if n > 0}


def reclaim_reason(
    teams: Teams, request: GangRequest, lease: Held, over: dict[Entry, int], *, short: bool
) -> str | None:
    """Why ``request`` (which fits within its team's nominal quota) reclaims the
    borrowing gang ``lease``, or None when its team is not above its own nominal.
    ``short``: the cohort's free quota is less than the request needs. Only then does
    Kueue preempt; a lender also reclaims its own borrowers when the devices are
    there but do not fit its gang (the ledger places gangs, Kueue does not)."""
    entry = _entry(teams, lease)
    if lease.team == request.team or entry not in over:
        return None
    if lease.lender == request.team:
        return f"reclaimed by its lender {request.team} for {request.gang_id}"
    if not short:
        return None
    label = entry[1][0] if entry[1][1] is None else f"{entry[1][1]} {entry[1][0]}"
    nominal = teams.nominal(*entry)
    return (
        # The gang is named, not its team: a viewer who may not see the gang must not
        # learn its team either (tideflow.ui.access redacts gangs).
        f"reclaimed for {request.gang_id}, within its team's quota: team {lease.team} uses "
        f"{nominal + over[entry]} of its {nominal} {label} quota"
    )


def bounded(
    teams: Teams,
    request: GangRequest,
    found: Iterable[tuple[Held, str]],
    held: Sequence[Held],
) -> Iterator[tuple[Held, str]]:
    """The candidates in order, less another team's gangs once those before them bring
    that team back to its nominal quota (Kueue re-checks that a queue still borrows
    before each further victim of it)."""
    over = over_nominal(teams, held)
    for lease, why in found:
        if lease.team != request.team:
            entry = _entry(teams, lease)
            if over.get(entry, 0) <= 0:
                continue  # what it still runs is its own quota
            over[entry] -= lease.devices
        yield lease, why


def return_reason(teams: Teams, request: GangRequest, lease: Held, now: float) -> str | None:
    """Why the borrowing gang ``lease``, past its rule's ``auto_return_timeout``, yields
    to ``request`` of another team (any team, not only its lender), or None."""
    rule = teams.rules.get((lease.lender or "", lease.team))
    if rule is None or rule.auto_return_timeout is None or lease.team == request.team:
        return None
    if now - lease.acquired_at < rule.auto_return_timeout:
        return None
    return (
        f"borrowed {now - lease.acquired_at:.0f}s, past its auto_return_timeout of "
        f"{rule.auto_return_timeout}s; returned for {request.gang_id}"
    )


def free_quota(teams: Teams, key: Key, used: Mapping[str, int]) -> int:
    """The quota on ``key`` nobody uses: the cohort's unused nominal quota, as Kueue
    counts it (the shared pool and every team's nominal, less what all use)."""
    nominal = sum(teams.nominal(team, key) for team in teams.teams)
    return teams.shared_pool(key) + nominal - sum(used.values())


def unclaimed_room(
    teams: Teams,
    request: GangRequest,
    key: Key,
    used: Mapping[str, int],
    waiting: Sequence[GangRequest],
) -> float:
    """What ``request``'s team may borrow on ``key`` and leave the quota that other
    teams' waiting gangs, each within its team's nominal quota, need (``math.inf``
    when none waits so). ``used``: the devices each team uses on ``key``."""
    claims: dict[str, int] = {}
    for waiter in waiting:
        if waiter.team == request.team or not teams.governs(waiter.team):
            continue
        if teams.key(waiter.team, waiter.device_class, waiter.model) != key:
            continue
        room = teams.nominal(waiter.team, key) - used.get(waiter.team, 0)
        least = (waiter.min_workers or waiter.workers) * waiter.devices_per_worker
        if least <= room:
            claims[waiter.team] = min(room, claims.get(waiter.team, 0) + least)
    if not claims:
        return math.inf
    own_room = max(0, teams.nominal(request.team, key) - used.get(request.team, 0))
    return max(0, free_quota(teams, key, used) - own_room - sum(claims.values()))
