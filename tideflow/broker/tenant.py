"""The broker as a tenant: inference as one of the cluster file's teams.

When the cluster file declares a team ``inference``, the GPUs the broker holds
are that team's quota, for the local actuator and the Kubernetes one alike:

* its ceiling is inference's nominal quota: a decision above it is capped, and
  the note says so (``ceiling``, ``capped``);
* what it lends is inference's idle quota, which other teams borrow under the
  rules whose lender is ``inference``;
* growing back is a reclaim as any team's (``tideflow.scheduling.reclaim``): only
  borrowing gangs of teams above their nominal quota are stopped (of any lender's
  quota when the free quota is short, else inference's own borrowers; and, as for
  any team, gangs borrowing past their rule's ``auto_return_timeout``), each with
  its rule's grace, and a gang within its own team's quota never is.

Locally the lease ledger keeps who borrows what and runs the reclaim. A cluster
keeps no such record, so ``borrowers`` replays the teams' admission over the
gangs the Kubernetes actuator finds, in the order they started, and ``reclaim``
asks the same victim rule the ledger uses. A cluster's queues also lend the
broker's pool to any team (``tideflow.compile.team_queues``), so there the
broker lends no more than inference's rules let anyone borrow (``floor``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tideflow.broker.snapshot import GangView
from tideflow.scheduling.model import DeviceClass, GangRequest
from tideflow.scheduling.quota import Eviction, Grant, Held, Key, Teams, admit, victims

INFERENCE_TEAM = "inference"
INFERENCE_PRIORITY = 1_000_000  # ahead of every training gang
INFERENCE_HELD = "broker/inference"  # what the broker holds, in a replayed snapshot


def governs_inference(teams: Teams | None) -> bool:
    """Whether the cluster file declares the team ``inference`` (the broker is a tenant)."""
    return teams is not None and teams.governs(INFERENCE_TEAM)


def ceiling(teams: Teams, key: Key, total: int) -> int:
    """The most GPUs the broker may hold: inference's nominal quota, within the total."""
    return min(total, teams.nominal(INFERENCE_TEAM, key))


def capped(wanted: int, most: int) -> tuple[int, str]:
    """The GPUs to hold for a decision of ``wanted``, and the note's words when capped."""
    if wanted <= most:
        return wanted, ""
    return most, f"; capped at inference's quota of {most}"


def lendable(teams: Teams, key: Key) -> int:
    """What inference's rules let other teams borrow of its quota at once: each rule's
    ``max_borrowable_ratio`` of its nominal, summed, within its ``lending_limit``
    (``tideflow.scheduling.quota.lendable`` per borrower; ``team_queues`` folds the same)."""
    quota = teams.quota(INFERENCE_TEAM, key)
    if quota is None:
        return 0
    by_rules = sum(
        math.floor(rule.max_borrowable_ratio * quota.nominal)
        for (lender, _), rule in teams.rules.items()
        if lender == INFERENCE_TEAM
    )
    limit = quota.nominal if quota.lending_limit is None else quota.lending_limit
    return int(min(limit, by_rules, quota.nominal))


def floor(teams: Teams, key: Key, total: int) -> int:
    """The fewest GPUs the broker keeps where the cluster's queues lend whatever it lends
    to any team: the part of inference's quota its rules let nobody borrow."""
    return min(
        ceiling(teams, key, total), teams.nominal(INFERENCE_TEAM, key) - lendable(teams, key)
    )


def borrowers(
    teams: Teams,
    gangs: Sequence[GangView],
    inference_gpus: int,
    device_class: DeviceClass,
    model: str | None,
    *,
    now: float,
) -> list[Held]:
    """The gangs as the lease ledger would hold them, inference's GPUs first.

    The teams' admission (``quota.admit``) is replayed in the order the gangs started:
    a team's first gangs fill its own nominal quota, and what a later one needs beyond
    it is borrowed from whom the rules say (the shared pool first, then a lender). A
    gang the rules would not have admitted holds what is beyond its team's quota on no
    lender's account, so no lender's reclaim takes it (the engine's queues let it
    start). A gang of no declared team is outside the quotas, as in the ledger. Every
    gang is taken to be of the pool's ``model``: it runs on the pool's nodes.
    """
    held = _holding([], inference_gpus, device_class, model)
    for gang in sorted(gangs, key=lambda g: (g.started_s, g.gang_id)):
        team = gang.team if gang.team is not None and teams.governs(gang.team) else ""
        borrowed, lender = 0, None
        if team:
            gpus, priority = gang.gpus, gang.priority
            request = GangRequest(gang.gang_id, team, device_class, model, 1, gpus, priority)
            grant = admit(teams, request, held)
            if isinstance(grant, Grant):
                borrowed, lender = grant.borrowed, grant.lender
            else:
                borrowed = _beyond_quota(teams, held, request)
        held.append(
            Held(
                gang.gang_id,
                team,
                device_class,
                model,
                gang.gpus,
                gang.priority,
                preemptible=True,
                acquired_at=gang.started_s,
                borrowed=borrowed,
                lender=lender,
                work_at_risk_s=max(0.0, now - gang.last_checkpoint_s),
            )
        )
    return held


def _beyond_quota(teams: Teams, held: Sequence[Held], request: GangRequest) -> int:
    """What a gang the rules would not have admitted holds beyond its team's quota."""
    team, mine = request.team, teams.key(request.team, request.device_class, request.model)
    used = sum(
        h.devices
        for h in held
        if h.team == team and teams.key(h.team, h.device_class, h.model) == mine
    )
    return max(0, min(request.devices, used + request.devices - teams.nominal(team, mine)))


def reclaim(
    teams: Teams,
    held: Sequence[Held],
    devices: int,
    device_class: DeviceClass,
    model: str | None,
    *,
    now: float,
    fits_without: Callable[[frozenset[str]], bool],
) -> tuple[Eviction, ...]:
    """The gangs inference may stop to take ``devices`` more, each with its grace: the
    ledger's own victim rule (``quota.victims``) for a reservation of inference's."""
    request = GangRequest(
        INFERENCE_HELD,
        INFERENCE_TEAM,
        device_class,
        model,
        1,
        devices,
        INFERENCE_PRIORITY,
        preemptible=False,
    )
    return victims(teams, request, held, now=now, fits_without=fits_without)


@dataclass(frozen=True)
class PoolNode:
    """A node of the broker's pool that training has now, and the gangs running on it."""

    name: str
    gpus: int
    gangs: frozenset[str]


@dataclass(frozen=True)
class Growth:
    nodes: tuple[str, ...]  # to move to inference, in order
    evictions: tuple[Eviction, ...]  # to stop first, each with its grace
    kept_by: tuple[str, ...]  # gangs on the nodes left that inference may not stop


def grow(
    teams: Teams,
    held: Sequence[Held],
    training: Sequence[PoolNode],
    *,
    have: int,
    target: int,
    most: int,
    device_class: DeviceClass,
    model: str | None,
    now: float,
) -> Growth:
    """Whole nodes for inference, from ``have`` GPUs towards ``target`` (never past
    ``most``): a node no gang runs on first, else one that inference's reclaim
    empties, a node at a time as the ledger reserves them. It stops at a node only
    gangs inference may not stop run on (within their team's own quota, or outside
    the quotas)."""
    planned = list(held)
    chosen: list[PoolNode] = []
    evictions: dict[str, Eviction] = {}
    gpus = have

    def clear(node: PoolNode, gone: frozenset[str]) -> bool:
        return node.gangs <= gone

    while gpus < target:
        left = [n for n in training if n not in chosen and gpus + n.gpus <= most]
        if not left:
            break
        gone = frozenset(evictions)
        node = next((n for n in left if clear(n, gone)), None)
        if node is None:
            found = reclaim(
                teams,
                planned,
                min(n.gpus for n in left),
                device_class,
                model,
                now=now,
                fits_without=lambda ids, gone=gone, left=left: any(  # type: ignore[misc]
                    clear(n, gone | ids) for n in left
                ),
            )
            if not found:
                break
            evictions.update((e.gang_id, e) for e in found)
            planned = [replace(h, evicting=True) if h.gang_id in evictions else h for h in planned]
            gone = frozenset(evictions)
            node = next(n for n in left if clear(n, gone))
        chosen.append(node)
        gpus += node.gpus
        planned = _holding(planned, gpus, device_class, model)
    kept = {g for n in training if n not in chosen for g in n.gangs} - set(evictions)
    return Growth(tuple(n.name for n in chosen), tuple(evictions.values()), tuple(sorted(kept)))


def _holding(
    held: list[Held], gpus: int, device_class: DeviceClass, model: str | None
) -> list[Held]:
    """``held`` with inference's GPUs at ``gpus`` (its reservations count in its quota)."""
    others = [h for h in held if h.gang_id != INFERENCE_HELD]
    mine = Held(
        INFERENCE_HELD,
        INFERENCE_TEAM,
        device_class,
        model,
        gpus,
        INFERENCE_PRIORITY,
        preemptible=False,
        acquired_at=0.0,
    )
    return [mine, *others]
