"""Each lease's time on its devices: recorded when it ends, read back for accounting.

The ledger records a row in ``usage`` when a lease ends (released, stopped, or
expired); leases still held count up to the window's end. ``UsageSpan`` is the
raw material of ``tideflow.scheduling.accounting``.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, replace

from tideflow.inventory import Inventory
from tideflow.scheduling import state
from tideflow.scheduling.model import DeviceUsage, Lease


@dataclass(frozen=True)
class UsageSpan:
    """One lease's time on its devices (within a window), for accounting."""

    gang_id: str  # PIPELINE/RUN/STEP for gangs; a broker reservation or a device lease else
    team: str
    device_class: str
    devices: int
    borrowed: int  # of ``devices``, beyond the team's nominal quota
    started_at: float
    ended_at: float
    ended_by: str  # released, preempted, forced, expired, or held (still running)
    lost_device_s: float  # device-seconds of work a forced stop threw away
    model: str | None = None  # the device model it was granted on (None: cpu, or unknown)

    @property
    def device_hours(self) -> float:
        return self.devices * max(0.0, self.ended_at - self.started_at) / 3600

    def clipped(self, since: float, until: float) -> UsageSpan:
        start, end = max(self.started_at, since), min(self.ended_at, until)
        lost = self.lost_device_s if since <= self.ended_at <= until else 0.0
        return replace(self, started_at=start, ended_at=max(start, end), lost_device_s=lost)


def placed_model(inventory: Inventory, lease: Lease) -> str | None:
    """The model of the devices a lease holds: the one its gang asked for, else its
    nodes' in ``inventory`` (a gang never mixes models); None on the CPU."""
    if lease.model is not None or lease.device_class == "cpu" or not lease.placements:
        return lease.model
    first = lease.placements[0].node
    return next((n.model for n in inventory.nodes if n.name == first), None)


def _granted_model(db: sqlite3.Connection, inventory: Inventory, lease: Lease) -> str | None:
    """The model recorded when the lease was placed (by the process that placed it:
    a reader opened with another inventory, which may end the lease, does not know
    its nodes), else what ``inventory`` says."""
    row = db.execute(
        "SELECT granted_model FROM leases WHERE lease_id = ?", (lease.lease_id,)
    ).fetchone()
    if row is not None and row[0] is not None:
        return str(row[0])
    return placed_model(inventory, lease)


def record(  # noqa: PLR0917 (a usage row's facts)
    db: sqlite3.Connection,
    inventory: Inventory,
    lease: Lease,
    ended_at: float,
    how: str,
    lost_s: float = 0.0,
) -> None:
    """The lease's time on its devices, as it ends (``how``: released, preempted,
    forced or expired); ``lost_s``: its work a forced stop threw away."""
    db.execute(
        "INSERT OR IGNORE INTO usage (lease_id, gang_id, team, device_class, devices, "
        "started_at, ended_at, ended_by, borrowed, lost_device_s, model) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            lease.lease_id,
            lease.gang_id,
            lease.team,
            lease.device_class,
            lease.devices,
            lease.acquired_at,
            max(ended_at, lease.acquired_at),
            how,
            lease.borrowed,
            lost_s * lease.devices,
            _granted_model(db, inventory, lease),
        ),
    )


def spans(
    db: sqlite3.Connection, inventory: Inventory, since: float, end: float
) -> list[UsageSpan]:
    """Every lease that overlapped [since, end], not yet clipped: ended ones from the
    usage journal, held ones up to ``end``."""
    found = [
        UsageSpan(
            str(g),
            str(t),
            str(c),
            int(n),
            int(b),
            float(a),
            float(z),
            str(how),
            float(lost),
            None if model is None else str(model),
        )
        for g, t, c, n, b, a, z, how, lost, model in db.execute(
            "SELECT gang_id, team, device_class, devices, borrowed, started_at, ended_at, "
            "ended_by, lost_device_s, model FROM usage WHERE ended_at > ? AND started_at < ?",
            (since, end),
        ).fetchall()
    ]
    for row in db.execute(
        f"SELECT {state.LEASE_COLUMNS} FROM leases WHERE acquired_at < ?", (end,)
    ).fetchall():
        lease = state.parse_lease(row)
        found.append(
            UsageSpan(
                lease.gang_id,
                lease.team,
                lease.device_class,
                lease.devices,
                lease.borrowed,
                lease.acquired_at,
                end,
                "held",
                0.0,
                _granted_model(db, inventory, lease),
            )
        )
    return found


def device_hours(clipped: list[UsageSpan]) -> list[DeviceUsage]:
    """Device-hours per (team, device class) of spans clipped to a window, sorted."""
    totals: dict[tuple[str, str], float] = {}
    for span in clipped:
        seconds = (span.ended_at - span.started_at) * span.devices
        totals[(span.team, span.device_class)] = (
            totals.get((span.team, span.device_class), 0.0) + seconds
        )
    return [
        DeviceUsage(team, device_class, seconds / 3600)
        for (team, device_class), seconds in sorted(totals.items())
    ]
