"""What admission decides on: the ledger's leases, queue and evictions, read once.

As Kueue's scheduler takes a snapshot of its cache at the start of a cycle and
decides on it alone, ``try_acquire`` reads one ``LedgerSnapshot`` inside its
transaction and the admission steps (``tideflow.scheduling.admission``) read
nothing else; the ledger then writes their one result. The snapshot also carries
the inventory and the teams it is judged against, so a step needs nothing but the
snapshot, the request and the time.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, replace

from tideflow.inventory import Inventory
from tideflow.scheduling import state
from tideflow.scheduling.model import GangRequest, Lease
from tideflow.scheduling.reservation import Claim
from tideflow.scheduling.teams import Held, Teams


@dataclass(frozen=True)
class LedgerSnapshot:
    """The ledger as one ``try_acquire`` found it (Kueue's cache snapshot)."""

    inventory: Inventory
    teams: Teams | None  # None: one pool, no quotas
    held: tuple[Held, ...]  # every lease (none without teams), its work at risk 0
    leases: tuple[Lease, ...]  # the same leases, in the same order
    waiting: tuple[GangRequest, ...]  # the waiting table, in its order
    enqueued_at: tuple[float, ...]  # when each of ``waiting`` was queued
    stopping: tuple[tuple[str, str, float], ...]  # (gang, for gang, deadline); teams only
    claims: tuple[tuple[str, str, int, str], ...]  # (node, device class, device, lease id)

    def used(self, device_class: str) -> dict[str, set[int]]:
        """The claimed devices of ``device_class``, per node (a fresh copy)."""
        found: dict[str, set[int]] = {}
        for node, cls, device, _ in self.claims:
            if cls == device_class:
                found.setdefault(node, set()).add(device)
        return found

    def claims_by_gang(self, device_class: str) -> dict[str, list[tuple[str, int]]]:
        """Each gang's claimed (node, device) pairs on ``device_class``."""
        gang_of = {lease.lease_id: lease.gang_id for lease in self.leases}
        found: dict[str, list[tuple[str, int]]] = {}
        for node, cls, device, lease_id in self.claims:
            if cls == device_class:
                found.setdefault(gang_of[lease_id], []).append((node, device))
        return found

    def reservation_claims(self, device_class: str) -> list[Claim]:
        """The claims on ``device_class`` as the choice of held nodes reads them."""
        by_id = {lease.lease_id: lease for lease in self.leases}
        found = []
        for node, cls, _, lease_id in sorted(self.claims, key=lambda c: c[0]):
            if cls == device_class:
                lease = by_id[lease_id]
                found.append(
                    Claim(node, lease_id, lease.acquired_at, lease.priority, lease.preemptible)
                )
        return found

    def queued_at(self, request: GangRequest, now: float) -> float:
        """When ``request`` was queued (``now`` if it is not)."""
        for other, at in zip(self.waiting, self.enqueued_at, strict=True):
            if other.gang_id == request.gang_id:
                return at
        return now

    def stopping_for(self, gang_id: str) -> list[tuple[str, float]]:
        """The gangs asked to stop for ``gang_id``, with their deadlines."""
        return [(gang, deadline) for gang, by_gang, deadline in self.stopping if by_gang == gang_id]

    def at_risk(
        self, work_at_risk: Callable[[Lease, float], float], now: float
    ) -> tuple[Held, ...]:
        """The leases with their work at risk (what eviction orders by)."""
        return tuple(
            replace(held, work_at_risk_s=work_at_risk(lease, now))
            for held, lease in zip(self.held, self.leases, strict=True)
        )


def read(db: sqlite3.Connection, inventory: Inventory, teams: Teams | None) -> LedgerSnapshot:
    """Every lease, waiting request, eviction and claim, as admission sees them.

    Without teams there is no quota to charge and nobody to stop: admission reads
    neither leases nor evictions, and the snapshot leaves them empty."""
    stopping: tuple[tuple[str, str, float], ...] = ()
    pairs: list[tuple[Lease, Held]] = []
    if teams is not None:
        stopping = tuple(
            (str(g), str(b), float(d))
            for g, b, d in db.execute(
                "SELECT gang_id, by_gang, deadline FROM evictions ORDER BY rowid"
            )
        )
        evicting = {gang for gang, _, _ in stopping}
        pairs = [
            state.parse_held(row, str(row[1]) in evicting)
            for row in db.execute(f"SELECT {state.LEASE_COLUMNS} FROM leases").fetchall()
        ]
    # in the table's order: queue_order's sort is stable, so the order of equal waiters
    # is this one
    rows = db.execute("SELECT request, enqueued_at FROM waiting ORDER BY rowid").fetchall()
    claims = tuple(
        (str(node), str(cls), int(device), str(lease_id))
        for node, cls, device, lease_id in db.execute(
            "SELECT node, device_class, device, lease_id FROM claims"
        )
    )
    return LedgerSnapshot(
        inventory,
        teams,
        tuple(h for _, h in pairs),
        tuple(lease for lease, _ in pairs),
        tuple(state.parse_request(r) for r, _ in rows),
        tuple(float(t) for _, t in rows),
        stopping,
        claims,
    )
