"""The lease ledger: all-or-nothing device reservations shared by many processes.

Every Airflow task process, the triggerer and the gang supervisors open the
same SQLite file. Each operation is one ``BEGIN IMMEDIATE`` transaction (one
writer at a time, WAL so readers do not block), and the database itself
refuses to book a device twice: ``claims`` has one row per (node, device)
with that pair as its primary key. A bug in placement would surface as an
integrity error, never as two gangs on one GPU.

Waiting and priority: a request that does not fit now is recorded in
``waiting`` without holding anything. A request that fits is still refused
while a waiter of higher priority (or equal priority, queued earlier) would
also fit now: that waiter goes first. Waiters that do not fit do not block
smaller requests behind them (best-effort FIFO, as Kueue's BestEffortFIFO).
The trade-off is that a large gang can starve behind a stream of small ones;
give it a higher priority, or let the broker reserve capacity for it.

Every process must place against the same inventory: two processes that name
one 8-GPU box differently would each see 8 free GPUs. The ledger keeps the
fingerprint of the inventory it last placed with; a process whose inventory
differs may place a gang only if every held claim is on a device its own
inventory has (a node added, say), and its inventory then becomes the
ledger's. Otherwise placing is refused with ``InventoryChangedError``, naming
the claims it cannot account for. Reading the ledger needs no inventory check.

Leases expire unless renewed (the holder died); waiters that stop polling
are forgotten. Both are cleaned inside every transaction, using the injected
clock so tests can replay time.
"""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from tideflow.inventory import Inventory
from tideflow.scheduling.model import DeviceUsage, GangRequest, Lease, Refusal, WorkerPlacement
from tideflow.scheduling.placement import place

_SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (
    lease_id TEXT PRIMARY KEY,
    gang_id TEXT NOT NULL UNIQUE,
    holder TEXT NOT NULL,
    team TEXT NOT NULL,
    device_class TEXT NOT NULL,
    model TEXT,
    placements TEXT NOT NULL,
    priority INTEGER NOT NULL,
    preemptible INTEGER NOT NULL,
    acquired_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    min_workers INTEGER
);
CREATE TABLE IF NOT EXISTS claims (
    node TEXT NOT NULL,
    device_class TEXT NOT NULL,
    device INTEGER NOT NULL,
    lease_id TEXT NOT NULL REFERENCES leases(lease_id) ON DELETE CASCADE,
    PRIMARY KEY (node, device_class, device)
);
CREATE TABLE IF NOT EXISTS waiting (
    gang_id TEXT PRIMARY KEY,
    request TEXT NOT NULL,
    priority INTEGER NOT NULL,
    enqueued_at REAL NOT NULL,
    last_seen REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS usage (
    lease_id TEXT PRIMARY KEY,
    gang_id TEXT NOT NULL,
    team TEXT NOT NULL,
    device_class TEXT NOT NULL,
    devices INTEGER NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL NOT NULL,
    ended_by TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS usage_by_end ON usage (ended_at);
"""


class LeaseLostError(Exception):
    """The lease expired, was released, or was taken back (e.g. by the broker)."""


class InventoryChangedError(Exception):
    """Held leases are on devices this process's inventory does not have."""


def inventory_fingerprint(inventory: Inventory) -> str:
    text = repr(
        sorted((n.name, n.device_class, n.model, n.devices, n.cpu) for n in inventory.nodes)
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class LeaseLedger:
    def __init__(
        self,
        path: Path,
        inventory: Inventory,
        *,
        clock: Callable[[], float] = time.time,
        waiter_timeout_s: float = 60.0,
    ) -> None:
        self.path = path
        self.inventory = inventory
        self.clock = clock
        self.waiter_timeout_s = waiter_timeout_s
        setup = sqlite3.connect(self.path, timeout=30)
        try:
            setup.execute("PRAGMA journal_mode=WAL")
            setup.executescript(_SCHEMA)
            columns = {row[1] for row in setup.execute("PRAGMA table_info(leases)")}
            if "min_workers" not in columns:  # a ledger written before elastic gangs
                setup.execute("ALTER TABLE leases ADD COLUMN min_workers INTEGER")
        finally:
            setup.close()
        # Checked when this process places a gang (try_acquire), not here: readers
        # (the tideflow page, the broker's view of leases) may open the ledger with
        # whatever inventory they were started with.
        self.fingerprint = inventory_fingerprint(inventory)

    def _adopt_inventory(self, db: sqlite3.Connection) -> None:
        """Record this process's inventory as the ledger's, if the held claims allow it."""
        stored = db.execute("SELECT value FROM meta WHERE key = 'inventory'").fetchone()
        if stored is not None and stored[0] == self.fingerprint:
            return
        unknown = [
            (node, device_class, device, gang)
            for node, device_class, device, gang in db.execute(
                "SELECT c.node, c.device_class, c.device, l.gang_id "
                "FROM claims c JOIN leases l USING (lease_id) ORDER BY c.node, c.device"
            )
            if not self._has_device(str(node), str(device_class), int(device))
        ]
        if unknown:
            shown = "; ".join(
                f"{node} {cls} {device} (gang {gang})" for node, cls, device, gang in unknown[:5]
            )
            more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            nodes = ", ".join(sorted(n.name for n in self.inventory.nodes))
            raise InventoryChangedError(
                f"lease ledger {self.path}: the inventory changed under held leases; "
                f"{len(unknown)} held claim(s) are on devices this process's inventory "
                f"'{self.inventory.name}' (nodes: {nodes}) does not have: {shown}{more}. "
                "Every process must use the same cluster file (TIDEFLOW_CLUSTER_FILE); "
                "or wait until those gangs end, then the new inventory takes over"
            )
        db.execute("INSERT OR REPLACE INTO meta VALUES ('inventory', ?)", (self.fingerprint,))

    def _has_device(self, node_name: str, device_class: str, device: int) -> bool:
        node = next((n for n in self.inventory.nodes if n.name == node_name), None)
        if node is None or device_class not in ("cpu", node.device_class):
            return False
        offered = node.cpu if device_class == "cpu" else node.devices
        return 0 <= device < offered

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA foreign_keys=ON")
            db.execute("PRAGMA busy_timeout=30000")
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()

    # -- housekeeping ---------------------------------------------------------------
    def _expire(self, db: sqlite3.Connection, now: float) -> None:
        # A lease nobody renewed counts as held until it expired: that is when
        # its devices became free for others.
        for row in db.execute("SELECT * FROM leases WHERE expires_at <= ?", (now,)).fetchall():
            lease = self._lease(row)
            self._record_usage(db, lease, lease.expires_at, "expired")
        db.execute("DELETE FROM leases WHERE expires_at <= ?", (now,))
        db.execute("DELETE FROM waiting WHERE last_seen < ?", (now - self.waiter_timeout_s,))

    @staticmethod
    def _lease(row: tuple[object, ...]) -> Lease:
        (
            lease_id,
            gang_id,
            holder,
            team,
            device_class,
            model,
            placements,
            priority,
            preemptible,
            acquired_at,
            expires_at,
            min_workers,
        ) = row
        return Lease(
            str(lease_id),
            str(gang_id),
            str(holder),
            str(team),
            str(device_class),
            None if model is None else str(model),
            Lease.placements_from_json(str(placements)),
            int(str(priority)),
            bool(preemptible),
            float(str(acquired_at)),
            float(str(expires_at)),
            None if min_workers is None else int(str(min_workers)),
        )

    def _used(self, db: sqlite3.Connection, device_class: str) -> dict[str, set[int]]:
        used: dict[str, set[int]] = {}
        for node, device in db.execute(
            "SELECT node, device FROM claims WHERE device_class = ?", (device_class,)
        ):
            used.setdefault(str(node), set()).add(int(device))
        return used

    # -- the API -------------------------------------------------------------------
    def try_acquire(self, request: GangRequest, holder: str, ttl_s: float) -> Lease | Refusal:
        with self._transaction() as db:
            now = self.clock()
            self._expire(db, now)
            self._adopt_inventory(db)  # another process may have placed with another one
            row = db.execute(
                "SELECT * FROM leases WHERE gang_id = ?", (request.gang_id,)
            ).fetchone()
            if row is not None:  # idempotent: the gang already holds its devices
                db.execute(
                    "UPDATE leases SET expires_at = MAX(expires_at, ?) WHERE gang_id = ?",
                    (now + ttl_s, request.gang_id),
                )
                return self._lease((*row[:10], max(float(row[10]), now + ttl_s), *row[11:]))
            used = self._used(db, request.device_class)
            placed = place(request, self.inventory, used)
            if isinstance(placed, Refusal):
                if placed.never:
                    db.execute("DELETE FROM waiting WHERE gang_id = ?", (request.gang_id,))
                    return placed
                self._wait(db, request, now)
                return Refusal(
                    placed.reason + self._held_by(db, request.device_class, now), never=False
                )
            ahead = self._waiter_ahead(db, request, used, now)
            if ahead is not None:
                self._wait(db, request, now)
                return Refusal(
                    f"fits now, but {ahead} waits ahead of it (higher priority, "
                    "or the same priority and queued earlier)",
                    never=False,
                )
            lease = Lease(
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
            )
            db.execute(
                "INSERT INTO leases VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    lease.lease_id,
                    lease.gang_id,
                    holder,
                    lease.team,
                    lease.device_class,
                    lease.model,
                    lease.placements_json(),
                    lease.priority,
                    int(lease.preemptible),
                    lease.acquired_at,
                    lease.expires_at,
                    lease.min_workers,
                ),
            )
            db.executemany(
                "INSERT INTO claims VALUES (?, ?, ?, ?)",
                [
                    (p.node, request.device_class, device, lease.lease_id)
                    for p in placed
                    for device in p.devices
                ],
            )
            db.execute("DELETE FROM waiting WHERE gang_id = ?", (request.gang_id,))
            return lease

    def _wait(self, db: sqlite3.Connection, request: GangRequest, now: float) -> None:
        db.execute(
            "INSERT INTO waiting VALUES (?, ?, ?, ?, ?) ON CONFLICT(gang_id) DO UPDATE SET "
            "request = excluded.request, priority = excluded.priority, last_seen = ?",
            (request.gang_id, request.to_json(), request.priority, now, now, now),
        )

    def _waiter_ahead(
        self, db: sqlite3.Connection, request: GangRequest, used: dict[str, set[int]], now: float
    ) -> str | None:
        mine = db.execute(
            "SELECT enqueued_at FROM waiting WHERE gang_id = ?", (request.gang_id,)
        ).fetchone()
        queued_at = float(mine[0]) if mine else now
        rows = db.execute(
            "SELECT gang_id, request FROM waiting WHERE gang_id != ? AND "
            "(priority > ? OR (priority = ? AND enqueued_at < ?)) "
            "ORDER BY priority DESC, enqueued_at ASC",
            (request.gang_id, request.priority, request.priority, queued_at),
        ).fetchall()
        for gang_id, text in rows:
            other = GangRequest.from_json(str(text))
            other_used = (
                used
                if other.device_class == request.device_class
                else self._used(db, other.device_class)
            )
            if not isinstance(place(other, self.inventory, other_used), Refusal):
                return str(gang_id)
        return None

    def _held_by(self, db: sqlite3.Connection, device_class: str, now: float) -> str:
        """Who holds the devices of ``device_class``: what a waiting gang's message names."""
        rows = db.execute(
            "SELECT * FROM leases WHERE device_class = ? ORDER BY acquired_at", (device_class,)
        ).fetchall()
        held = [
            f"{lease.gang_id} (team {lease.team}, {sum(len(p.devices) for p in lease.placements)}"
            f" device(s), holder {lease.holder}, for {now - lease.acquired_at:.0f}s)"
            for lease in map(self._lease, rows)
        ]
        return f"; held by {', '.join(held)}" if held else ""

    def forget(self, gang_id: str) -> None:
        """Drop a queued request (its owner found other devices, or gave up)."""
        with self._transaction() as db:
            db.execute("DELETE FROM waiting WHERE gang_id = ?", (gang_id,))

    def renew(self, lease_id: str, ttl_s: float) -> Lease:
        with self._transaction() as db:
            now = self.clock()
            self._expire(db, now)
            updated = db.execute(
                "UPDATE leases SET expires_at = ? WHERE lease_id = ?", (now + ttl_s, lease_id)
            ).rowcount
            if updated == 0:
                raise LeaseLostError(f"lease {lease_id} expired or was released")
            row = db.execute("SELECT * FROM leases WHERE lease_id = ?", (lease_id,)).fetchone()
            return self._lease(row)

    def release(self, lease_id: str) -> None:
        with self._transaction() as db:
            row = db.execute("SELECT * FROM leases WHERE lease_id = ?", (lease_id,)).fetchone()
            if row is not None:
                self._record_usage(db, self._lease(row), self.clock(), "released")
            db.execute("DELETE FROM leases WHERE lease_id = ?", (lease_id,))

    @staticmethod
    def _record_usage(db: sqlite3.Connection, lease: Lease, ended_at: float, how: str) -> None:
        devices = sum(len(p.devices) for p in lease.placements)
        db.execute(
            "INSERT OR IGNORE INTO usage VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                lease.lease_id,
                lease.gang_id,
                lease.team,
                lease.device_class,
                devices,
                lease.acquired_at,
                max(ended_at, lease.acquired_at),
                how,
            ),
        )

    def device_hours(self, since: float, until: float | None = None) -> list[DeviceUsage]:
        """Device-hours held per (team, device class) within [since, until].

        Ended leases come from the usage journal; leases still held count up to
        ``until`` (default: now). Only the part of each lease inside the window
        is counted.
        """
        with self._transaction() as db:
            now = self.clock()
            self._expire(db, now)
            end = now if until is None else until
            spans: list[tuple[str, str, int, float, float]] = [
                (str(t), str(c), int(n), float(a), float(b))
                for t, c, n, a, b in db.execute(
                    "SELECT team, device_class, devices, started_at, ended_at FROM usage "
                    "WHERE ended_at > ? AND started_at < ?",
                    (since, end),
                )
            ]
            for row in db.execute("SELECT * FROM leases WHERE acquired_at < ?", (end,)):
                lease = self._lease(row)
                devices = sum(len(p.devices) for p in lease.placements)
                spans.append((lease.team, lease.device_class, devices, lease.acquired_at, end))
        totals: dict[tuple[str, str], float] = {}
        for team, device_class, devices, start, stop in spans:
            seconds = max(0.0, min(stop, end) - max(start, since)) * devices
            totals[(team, device_class)] = totals.get((team, device_class), 0.0) + seconds
        return [
            DeviceUsage(team, device_class, seconds / 3600)
            for (team, device_class), seconds in sorted(totals.items())
        ]

    def lease_for(self, gang_id: str) -> Lease | None:
        with self._transaction() as db:
            self._expire(db, self.clock())
            row = db.execute("SELECT * FROM leases WHERE gang_id = ?", (gang_id,)).fetchone()
            return None if row is None else self._lease(row)

    def leases(self) -> list[Lease]:
        with self._transaction() as db:
            self._expire(db, self.clock())
            rows = db.execute("SELECT * FROM leases ORDER BY acquired_at").fetchall()
            return [self._lease(row) for row in rows]

    def waiting(self) -> list[tuple[GangRequest, float]]:
        with self._transaction() as db:
            self._expire(db, self.clock())
            rows = db.execute(
                "SELECT request, enqueued_at FROM waiting ORDER BY priority DESC, enqueued_at"
            ).fetchall()
            return [(GangRequest.from_json(str(r)), float(t)) for r, t in rows]

    def used_devices(self, device_class: str | None = None) -> dict[str, set[int]]:
        with self._transaction() as db:
            self._expire(db, self.clock())
            if device_class is not None:
                return self._used(db, device_class)
            used: dict[str, set[int]] = {}
            for node, cls, device in db.execute("SELECT node, device_class, device FROM claims"):
                used.setdefault(f"{node}/{cls}", set()).add(int(device))
            return used


__all__ = ["LeaseLedger", "LeaseLostError", "WorkerPlacement"]
