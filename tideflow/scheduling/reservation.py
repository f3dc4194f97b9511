"""Reservations: the nodes held for a gang that has waited past ``reserve_after``.

Without them a large gang can starve behind a stream of small ones: whenever a
node empties, a small gang takes part of it, and two empty nodes never come by
together. A batch scheduler's answer (Slurm's backfill, Kueue's StrictFIFO in
spirit) is to give the waiting gang the nodes where it can start soonest and
hold only those: every gang behind it may start anywhere else (backfill), and
the held nodes drain. Everything here is a pure function of the ledger's
snapshot (waiting gangs, leases, claimed devices), so every decision replays.

Who reserves, per device class: for each team, the first of its gangs (highest
priority, then queued earliest) that has waited ``reserve_after`` and that its
quota admits now: it waits for room on nodes, not for quota. One per team, so a
team with ten large gangs waiting holds the room of one; the next reserves when
this one starts. Reservations of several teams are taken in that order and hold
disjoint nodes.

A gang that waits for its team's quota reserves nothing, and its team's smaller
gangs may start in quota that frees meanwhile. Holding the quota for it would
leave the quota idle while the team's running gangs drain down to its size,
with no run times to bound that: the benchmark's teams (docs/benchmarks.md)
queued 1.5-3.8x longer with such a hold and their 20-GPU gangs waited longer too,
because a team that drains for each large gang serves less. Once its quota
admits it, it reserves and keeps that quota (below).

Which nodes (``placement.nodes_to_hold``): without run times, the ledger ranks
the nodes that offer the class by the devices of leases started since the
reservation began (normally none: nothing behind it lands there, so the choice
stays put while the nodes drain), then most free devices, then fewest leases to
wait for, then name; it holds the first ones that have room for all its workers.
A node claimed by a lease ahead of it that nothing may stop (the broker's
inference reservations) is never held: it drains only when that lease's owner
lets it go.

Who is held back: only gangs *behind* it (lower priority, or the same priority
and queued later); a gang ahead of it never waits for it.
  * Nodes: a gang behind it places off the held nodes, whatever its team; one
    that fits only on them waits. This includes another team's gang within its
    own quota. Its quota is a guarantee of devices counted against the team,
    which a reservation never takes, not of particular nodes; the ledger already
    holds such a gang back behind a waiter ahead of it that fits now
    (admission's step 6), and a reservation extends "fits now" to "fits once its
    nodes drain". If another team's gangs could take a held node whenever they
    had no other room, a team running a gang on every node would starve the
    large gang forever, which is the case reservations exist for. The wait this
    imposes is bounded: the held nodes drain within the longest run that was on
    them when the reservation began.
  * Quota: its own team's gangs, and gangs that borrow, start only if the
    reserved gang would still be admitted with them running. Otherwise small
    gangs of its team would take the quota it has while its nodes drain, and it
    would wait for quota again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tideflow.inventory import Inventory
from tideflow.scheduling.model import GangRequest
from tideflow.scheduling.placement import nodes_to_hold
from tideflow.scheduling.quota import Grant, admit
from tideflow.scheduling.teams import Held, Teams


@dataclass(frozen=True)
class Reservation:
    request: GangRequest
    queued_at: float
    since: float  # when it began to hold (queued_at + reserve_after)
    nodes: tuple[str, ...]  # () when no nodes are left to hold: it holds its quota only

    def ahead_of(self, request: GangRequest, queued_at: float) -> bool:
        """Whether ``request`` (queued at ``queued_at``) is behind this gang."""
        mine = self.request
        return mine.gang_id != request.gang_id and (
            mine.priority > request.priority
            or (mine.priority == request.priority and self.queued_at < queued_at)
        )

    def describe(self, now: float, limit: float) -> str:
        return (
            f"reserved for {self.request.gang_id}, which has waited "
            f"{now - self.queued_at:.0f}s (reserve_after {limit}s)"
        )


@dataclass(frozen=True)
class Claim:
    """One claimed device, as the choice of held nodes reads it."""

    node: str
    lease_id: str
    acquired_at: float
    priority: int = 0  # its lease's
    preemptible: bool = True


def reservations(
    teams: Teams,
    inventory: Inventory,
    device_class: str,
    *,
    waiting: Sequence[tuple[GangRequest, float]],
    held: Sequence[Held],
    used: Mapping[str, set[int]],
    claims: Sequence[Claim],
    now: float,
) -> list[Reservation]:
    """The reservations on ``device_class``, in the order they chose their nodes."""
    limit = teams.reserve_after_s
    if limit is None:
        return []
    found: list[Reservation] = []
    taken: set[str] = set()
    for request, at in _first_per_team(teams, device_class, waiting, held, since=now - limit):
        since = at + limit
        newer, leases, kept = _claimed(claims, request, since)
        nodes = nodes_to_hold(
            request, inventory, used, newer=newer, leases=leases, taken=taken | kept
        )
        taken.update(nodes)
        found.append(Reservation(request, at, since, nodes))
    return found


def _first_per_team(
    teams: Teams,
    device_class: str,
    waiting: Sequence[tuple[GangRequest, float]],
    held: Sequence[Held],
    *,
    since: float,
) -> list[tuple[GangRequest, float]]:
    """Each team's first gang on ``device_class`` queued by ``since`` that its quota
    admits now, in queue order (priority, then queued earliest)."""
    demand = [request for request, _ in waiting]
    first: list[tuple[GangRequest, float]] = []
    teams_seen: set[str] = set()
    # Admission reads the gang's shape, team and priority, not its name (its own
    # waiting entry counts only as a lender's demand, and a team does not lend to
    # itself): a thousand waiting gangs of a few shapes are judged a few times.
    admitted: dict[tuple[object, ...], bool] = {}
    for request, at in sorted(waiting, key=lambda w: (-w[0].priority, w[1])):
        if request.device_class != device_class or request.team in teams_seen:
            continue
        if at > since:
            continue
        shape = (
            request.team,
            request.model,
            request.workers,
            request.devices_per_worker,
            request.min_workers,
            request.priority,
            request.priority_class,
        )
        if shape not in admitted:
            admitted[shape] = isinstance(admit(teams, request, held, demand), Grant)
        # A gang its quota does not admit now waits for its team's own gangs to end,
        # not for room on nodes: it reserves nothing (see the module's docstring).
        if not admitted[shape]:
            continue
        teams_seen.add(request.team)
        first.append((request, at))
    return first


def _claimed(
    claims: Sequence[Claim], request: GangRequest, since: float
) -> tuple[dict[str, int], dict[str, int], set[str]]:
    """Per node, what the choice of ``request``'s held nodes reads: devices claimed by
    leases started after ``since``, the leases to wait for, and the nodes a lease
    ahead of it that nothing may stop keeps."""
    newer: dict[str, int] = {}
    leases: dict[str, set[str]] = {}
    kept: set[str] = set()
    for claim in claims:
        leases.setdefault(claim.node, set()).add(claim.lease_id)
        if claim.acquired_at > since:
            newer[claim.node] = newer.get(claim.node, 0) + 1
        # A lease ahead of the gang that nothing may stop (the broker's inference
        # reservations) keeps its node as long as it needs it: no place to hold.
        if not claim.preemptible and claim.priority > request.priority:
            kept.add(claim.node)
    return newer, {node: len(ids) for node, ids in leases.items()}, kept


def quota_held_back(
    teams: Teams,
    request: GangRequest,
    grant: Grant,
    *,
    ahead: Sequence[Reservation],
    held: Sequence[Held],
    waiting: Sequence[GangRequest],
    now: float,
) -> Reservation | None:
    """The reservation whose quota ``request`` would take, if any: a gang of its team,
    or a gang that borrows, starts only if the reserved gang is still admitted with it
    running."""
    if not any(r.request.team == request.team for r in ahead) and grant.borrowed == 0:
        return None
    started = Held(
        request.gang_id,
        request.team,
        request.device_class,
        request.model,
        grant.devices,
        request.priority,
        request.preemptible,
        now,
        grant.borrowed,
        grant.lender if grant.borrowed else None,
    )
    rest = [w for w in waiting if w.gang_id != request.gang_id]
    for reservation in ahead:
        if reservation.request.team != request.team and grant.borrowed == 0:
            continue
        if not isinstance(admit(teams, reservation.request, [*held, started], rest), Grant):
            return reservation
    return None
