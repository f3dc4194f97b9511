"""Who must stop so that a gang can start: a pure function of the snapshot, like ``quota``.

The gang fits its quota but the devices are held; whose gangs may be stopped
(after a checkpoint) to make room? As Kueue's preemption decides it:
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
turn out not to be needed are dropped again. Each stops within its grace: its
borrowing rule's, else the cluster's default.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tideflow.scheduling import reclaim
from tideflow.scheduling.model import GangRequest
from tideflow.scheduling.teams import Held, Teams, least, usage


@dataclass(frozen=True)
class Eviction:
    """A gang to ask to stop, why, and how long it has to checkpoint first; as the ledger
    records it (``LeaseLedger.evictions``), also for whom, when, and whether its workers
    were signalled."""

    gang_id: str
    reason: str
    grace_s: float
    by_gang: str = ""  # the gang it makes room for, once recorded
    requested_at: float = 0.0  # once recorded
    signalled: bool = False

    @property
    def deadline(self) -> float:
        """When it is stopped anyway (its uncommitted work is lost)."""
        return self.requested_at + self.grace_s


def within_quota(teams: Teams, request: GangRequest, held: Sequence[Held]) -> bool:
    """Whether the gang fits its team's own nominal quota (it borrows nothing)."""
    key = teams.key(request.team, request.device_class, request.model)
    used, _ = usage(teams, held, key)
    return used.get(request.team, 0) + least(request) <= teams.nominal(request.team, key)


def _preempt_reason(request: GangRequest, lease: Held, *, borrowing: bool) -> str | None:
    """Why ``request`` (of a class that preempts) stops the lower-priority ``lease``."""
    if lease.priority >= request.priority:
        return None
    if lease.team == request.team:
        return f"preempted by {request.gang_id} (priority {request.priority})"
    if borrowing:
        return (
            f"preempted by {request.gang_id} (priority {request.priority}): it "
            f"borrows, and runs at priority {lease.priority}"
        )
    return None


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
    short = reclaim.free_quota(teams, key, usage(teams, held, key)[0]) < least(request)
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
        if why is None and preempts:
            why = _preempt_reason(request, lease, borrowing=borrowing)
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
