"""Evictions: the gangs the ledger asks to stop, and for whom.

The admission step that makes room (``make_room``) chooses them from a snapshot
(``tideflow.scheduling.preemption`` says who may be stopped and why, reclaim and
priority preemption alike); the ledger records each in ``evictions`` with its
deadline (its grace). The gang layer, which can signal gangs, reads them
(``LeaseLedger.evictions``), asks each gang to checkpoint and stop, and stops it
anyway at the deadline; a gang's release ends its eviction (it ends "preempted",
or "forced" when work was lost).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Collection

from tideflow.scheduling import journal
from tideflow.scheduling.model import GangRequest, Lease, Refusal
from tideflow.scheduling.placement import place, without_nodes
from tideflow.scheduling.preemption import Eviction, candidates, victims
from tideflow.scheduling.quota import Grant, admit, shrink_to
from tideflow.scheduling.snapshot import LedgerSnapshot


# -- who must stop (an admission step) ------------------------------------------------
def make_room(
    snap: LedgerSnapshot,
    request: GangRequest,
    now: float,
    work_at_risk: Callable[[Lease, float], float],
    *,
    held_nodes: Collection[str] = frozenset(),
) -> tuple[str | None, tuple[Eviction, ...]]:
    """The gangs in the way, to be asked to stop (checkpoint first), and what the
    request waits for: those already stopping for it, or these; (None, ()) when
    stopping gangs would not let it start. Stopping gangs on ``held_nodes`` (held
    for a reserved gang ahead) does not help."""
    teams = snap.teams
    assert teams is not None
    pending = snap.stopping_for(request.gang_id)
    if pending:
        names = ", ".join(f"{g} (grace ends in {max(0.0, d - now):.0f}s)" for g, d in pending)
        return f"waiting for {names} to checkpoint and stop", ()
    if not candidates(teams, request, snap.held, now=now):
        return None, ()  # nobody it may stop: no need to work out whether that would help
    held = snap.at_risk(work_at_risk, now)
    in_use = snap.used(request.device_class)
    claims = snap.claims_by_gang(request.device_class)

    def fits_without(gangs: frozenset[str]) -> bool:
        rest = [h for h in held if h.gang_id not in gangs]
        quota = admit(teams, request, rest, snap.waiting)
        if not isinstance(quota, Grant):
            return False
        free = {node: set(devices) for node, devices in in_use.items()}
        for gang in gangs:
            for node, device in claims.get(gang, ()):
                free[node].discard(device)
        if held_nodes:
            free = without_nodes(snap.inventory, free, held_nodes, request.device_class)
        return not isinstance(place(shrink_to(request, quota), snap.inventory, free), Refusal)

    chosen = victims(teams, request, held, now=now, fits_without=fits_without)
    if not chosen:
        return None, ()
    names = ", ".join(e.gang_id for e in chosen)
    return f"stopping {names} (checkpoint first) to make room: {chosen[0].reason}", chosen


# -- the evictions table ----------------------------------------------------------------
def ask_to_stop(  # noqa: PLR0917 (an eviction row's facts)
    db: sqlite3.Connection,
    gang_id: str,
    by_gang: str,
    reason: str,
    now: float,
    grace_s: float,
    *,
    signalled: bool = False,
) -> bool:
    """Record that ``gang_id`` must stop within ``grace_s`` for ``by_gang``, and journal
    it; False when the gang holds no lease."""
    row = db.execute("SELECT team FROM leases WHERE gang_id = ?", (gang_id,)).fetchone()
    if row is None:
        return False
    db.execute(
        "INSERT OR IGNORE INTO evictions VALUES (?, ?, ?, ?, ?, ?)",
        (gang_id, by_gang, reason, now, now + grace_s, int(signalled)),
    )
    journal.write(db, now, gang_id, str(row[0]), "evict", reason)
    return True


def listed(db: sqlite3.Connection) -> list[Eviction]:
    """Every eviction, oldest first."""
    rows = db.execute(
        "SELECT gang_id, by_gang, reason, requested_at, deadline, signalled "
        "FROM evictions ORDER BY requested_at"
    ).fetchall()
    return [
        Eviction(str(g), str(r), float(d) - float(a), str(b), float(a), bool(s))
        for g, b, r, a, d, s in rows
    ]


def withdraw(db: sqlite3.Connection, by_gang: str) -> None:
    """Drop the evictions made for ``by_gang`` that nobody has carried out yet (a gang
    already asked to stop goes on stopping; it requeues and resumes from its
    checkpoint)."""
    db.execute("DELETE FROM evictions WHERE by_gang = ? AND signalled = 0", (by_gang,))


def done(db: sqlite3.Connection, gang_id: str) -> bool:
    """End ``gang_id``'s eviction (it released its lease); whether it had one."""
    return bool(db.execute("DELETE FROM evictions WHERE gang_id = ?", (gang_id,)).rowcount)
