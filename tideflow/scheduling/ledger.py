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
So that a large gang cannot starve behind a stream of small ones, a gang that
has waited ``scheduling.reserve_after`` holds the nodes where it can start
soonest (and the quota it needs): gangs behind it start on the other nodes
(``tideflow.scheduling.reservation``).

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
import functools
import hashlib
import re
import sqlite3
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

from tideflow.inventory import Inventory
from tideflow.scheduling.model import DeviceUsage, GangRequest, Lease, Refusal, WorkerPlacement
from tideflow.scheduling.placement import place, without_nodes
from tideflow.scheduling.quota import (
    Grant,
    Held,
    Teams,
    admit,
    candidates,
    queue_order,
    shrink_to,
    victims,
)
from tideflow.scheduling.reservation import Claim, Reservation, quota_held_back, reservations
from tideflow.storage.sqlite_columns import add_missing_columns

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
    min_workers INTEGER,
    borrowed INTEGER NOT NULL DEFAULT 0,
    lender TEXT,
    priority_class TEXT,
    granted_model TEXT
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
    last_seen REAL NOT NULL,
    reason TEXT NOT NULL DEFAULT ''
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
    ended_by TEXT NOT NULL,
    borrowed INTEGER NOT NULL DEFAULT 0,
    lost_device_s REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS usage_by_end ON usage (ended_at);
CREATE TABLE IF NOT EXISTS evictions (
    gang_id TEXT PRIMARY KEY,
    by_gang TEXT NOT NULL,
    reason TEXT NOT NULL,
    requested_at REAL NOT NULL,
    deadline REAL NOT NULL,
    signalled INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS journal (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    gang_id TEXT NOT NULL,
    team TEXT NOT NULL,
    action TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS journal_by_action ON journal (action, at);
"""


# Columns added since the first release, in the order they were added (ALTER TABLE
# appends them, so a migrated table has the same column order as a new one).
_ADDED_COLUMNS = {
    "leases": (
        ("min_workers", "INTEGER"),
        ("borrowed", "INTEGER NOT NULL DEFAULT 0"),
        ("lender", "TEXT"),
        ("priority_class", "TEXT"),
        # the model of the nodes it was placed on, by the process that placed it
        ("granted_model", "TEXT"),
    ),
    "usage": (
        ("borrowed", "INTEGER NOT NULL DEFAULT 0"),
        ("lost_device_s", "REAL NOT NULL DEFAULT 0"),
        ("model", "TEXT"),  # the device model the lease was granted on; NULL: unknown
    ),
    "waiting": (("reason", "TEXT NOT NULL DEFAULT ''"),),
}
_LEASE_COLUMNS = (
    "lease_id, gang_id, holder, team, device_class, model, placements, priority, "
    "preemptible, acquired_at, expires_at, min_workers, borrowed, lender, priority_class"
)


# A waiting gang's poll reads every waiting request and every lease, and nearly all of
# them are the rows the last poll read: each stored text is parsed once. The key is the
# whole stored text (a lease's whole row), so a hit is the parse of exactly that text and
# nothing can be stale; the objects are frozen, so sharing them is safe. Bounded (least
# recently used out); PARSE_CACHE = False parses every time (the tests compare the two).
PARSE_CACHE = True
_PARSED = 8192  # entries per cache: above any realistic count of waiting gangs or leases


@functools.lru_cache(maxsize=_PARSED)
def _cached_request(text: str) -> GangRequest:
    return GangRequest.from_json(text)


def _request(text: object) -> GangRequest:
    """A stored request (the ``waiting`` table's JSON), parsed."""
    return _cached_request(str(text)) if PARSE_CACHE else GangRequest.from_json(str(text))


def _parse_lease(row: tuple[object, ...]) -> Lease:
    """A ``leases`` row (``_LEASE_COLUMNS``), as a lease."""
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
        borrowed,
        lender,
        priority_class,
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
        int(str(borrowed or 0)),
        None if lender is None else str(lender),
        None if priority_class is None else str(priority_class),
    )


def _parse_held(row: tuple[object, ...], evicting: bool) -> tuple[Lease, Held]:
    """A ``leases`` row as the quota policy sees it; its work at risk is left 0 (only
    eviction orders by it: ``LeaseLedger._at_risk`` fills it in then)."""
    lease = _parse_lease(row)
    held = Held(
        lease.gang_id,
        lease.team,
        lease.device_class,
        lease.model,
        lease.devices,
        lease.priority,
        lease.preemptible,
        lease.acquired_at,
        lease.borrowed,
        lease.lender,
        0.0,
        evicting,
    )
    return lease, held


_cached_lease = functools.lru_cache(maxsize=_PARSED)(_parse_lease)
_cached_held = functools.lru_cache(maxsize=_PARSED)(_parse_held)


def _shape(reason: object) -> str:
    return re.sub(r"\d+", "#", str(reason))


class _View(NamedTuple):
    """The leases and waiting requests the quota policy decides on, read once."""

    held: tuple[Held, ...]  # their work at risk 0 (what admission and queueing read)
    leases: tuple[Lease, ...]  # the same leases, in the same order
    waiting: tuple[GangRequest, ...]  # the waiting table, in its order
    enqueued_at: tuple[float, ...]  # when each of ``waiting`` was queued


@dataclass(frozen=True)
class EvictionRecord:
    """A gang the ledger asked to stop so that ``by_gang`` can start."""

    gang_id: str
    by_gang: str
    reason: str
    requested_at: float
    deadline: float  # stop it anyway after this (its uncommitted work is lost)
    signalled: bool


@dataclass(frozen=True)
class JournalEntry:
    at: float
    gang_id: str
    team: str
    action: str  # admit, wait, refuse, evict, preempted, forced
    reason: str


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
        work_at_risk: Callable[[Lease, float], float] | None = None,
    ) -> None:
        self.path = path
        self.inventory = inventory
        self.clock = clock
        self.waiter_timeout_s = waiter_timeout_s
        # The cluster file's teams: quotas, borrowing and preemption (None: one pool).
        self.teams = Teams.of(inventory)
        # Seconds of a gang's work a stop would lose: since its last checkpoint when the
        # caller can read its store (the gang layer), else since its lease began.
        self.work_at_risk = work_at_risk or (lambda lease, now: max(0.0, now - lease.acquired_at))
        setup = sqlite3.connect(self.path, timeout=30)
        try:
            setup.execute("PRAGMA journal_mode=WAL")
            setup.executescript(_SCHEMA)
            add_missing_columns(setup, _ADDED_COLUMNS)  # a ledger written by an older tideflow
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
        expired = db.execute(
            f"SELECT {_LEASE_COLUMNS} FROM leases WHERE expires_at <= ?", (now,)
        ).fetchall()
        for row in expired:
            lease = self._lease(row)
            self._record_usage(db, lease, lease.expires_at, "expired")
        if expired:
            db.execute("DELETE FROM leases WHERE expires_at <= ?", (now,))
        db.execute("DELETE FROM waiting WHERE last_seen < ?", (now - self.waiter_timeout_s,))
        db.execute("DELETE FROM evictions WHERE gang_id NOT IN (SELECT gang_id FROM leases)")

    @staticmethod
    def _lease(row: tuple[object, ...]) -> Lease:
        return _cached_lease(row) if PARSE_CACHE else _parse_lease(row)

    def _used(self, db: sqlite3.Connection, device_class: str) -> dict[str, set[int]]:
        used: dict[str, set[int]] = {}
        for node, device in db.execute(
            "SELECT node, device FROM claims WHERE device_class = ?", (device_class,)
        ):
            used.setdefault(node, set()).add(device)  # TEXT and INTEGER columns
        return used

    # -- the API -------------------------------------------------------------------
    def try_acquire(self, request: GangRequest, holder: str, ttl_s: float) -> Lease | Refusal:
        with self._transaction() as db:
            now = self.clock()
            self._expire(db, now)
            self._adopt_inventory(db)  # another process may have placed with another one
            row = db.execute(
                f"SELECT {_LEASE_COLUMNS} FROM leases WHERE gang_id = ?", (request.gang_id,)
            ).fetchone()
            if row is not None:  # idempotent: the gang already holds its devices
                db.execute(
                    "UPDATE leases SET expires_at = MAX(expires_at, ?) WHERE gang_id = ?",
                    (now + ttl_s, request.gang_id),
                )
                held = self._lease(row)
                return replace(held, expires_at=max(held.expires_at, now + ttl_s))
            # What the quota policy decides on: read once per transaction.
            view = _View((), (), (), ())
            if self.teams is None:
                grant: Grant | None = None
                wanted = request
            else:
                view = self._view(db)
                quota = admit(self.teams, request, view.held, view.waiting)
                if not isinstance(quota, Grant):
                    if quota.never:
                        db.execute("DELETE FROM waiting WHERE gang_id = ?", (request.gang_id,))
                        self._journal(db, now, request, "refuse", quota.reason)
                        return Refusal(quota.reason, never=True)
                    # a preempting class, or an expired borrow, may free quota too
                    evicting = self._make_room(db, request, view, now)
                    return self._refuse(db, request, now, evicting or quota.reason)
                grant = quota
                wanted = shrink_to(request, grant)
            used = self._used(db, request.device_class)
            booked = (
                []
                if grant is None
                else self._reservations(db, request.device_class, view, used, now)
            )
            placed = self._place(
                db, request, wanted, view, now, grant=grant, booked=booked, used=used
            )
            if isinstance(placed, Refusal):
                return placed
            ahead = self._waiter_ahead(db, request, used, view, now, booked=booked)
            if ahead is not None:
                return self._refuse(
                    db,
                    request,
                    now,
                    f"fits now, but {ahead} waits ahead of it (higher priority, "
                    + ("a team using less of its quota, " if self.teams else "")
                    + "or the same priority and queued earlier)",
                )
            borrowed = grant.borrowed if grant is not None else 0
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
                # an elastic gang placed on fewer devices than granted borrows less
                max(0, borrowed - (grant.devices - sum(len(p.devices) for p in placed)))
                if grant is not None
                else 0,
                grant.lender if grant is not None and borrowed else None,
                request.priority_class,
            )
            db.execute(
                f"INSERT INTO leases ({_LEASE_COLUMNS}) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                    lease.borrowed,
                    lease.lender,
                    lease.priority_class,
                ),
            )
            db.execute(
                "UPDATE leases SET granted_model = ? WHERE lease_id = ?",
                (self._placed_model(lease), lease.lease_id),
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
            # Started without them after all: gangs not yet asked to stop for it keep running.
            db.execute(
                "DELETE FROM evictions WHERE by_gang = ? AND signalled = 0", (request.gang_id,)
            )
            if self.teams is not None:
                source = (
                    f", {lease.borrowed} borrowed from "
                    + ("the shared pool" if lease.lender == "" else str(lease.lender))
                    if lease.borrowed
                    else ""
                )
                self._journal(db, now, request, "admit", f"{lease.devices} device(s){source}")
            return lease

    def _place(
        self,
        db: sqlite3.Connection,
        request: GangRequest,
        wanted: GangRequest,
        view: _View,
        now: float,
        *,
        grant: Grant | None,
        booked: list[Reservation],
        used: dict[str, set[int]],
    ) -> tuple[WorkerPlacement, ...] | Refusal:
        """Where the gang goes, off the nodes held for reserved gangs ahead of it; or why
        it waits (recorded, and its evictions asked for)."""
        held_nodes: frozenset[str] = frozenset()
        ahead: list[Reservation] = []
        if grant is not None and booked:
            queued_at = self._queued_at(request, view, now)
            ahead = [r for r in booked if r.ahead_of(request, queued_at)]
            refusal = self._held_back(request, grant, ahead, view, now)
            if refusal is not None:
                return self._refuse(db, request, now, refusal)
            held_nodes = frozenset(node for r in ahead for node in r.nodes)
        fence = (
            without_nodes(self.inventory, used, held_nodes, request.device_class)
            if held_nodes
            else used
        )
        placed = place(wanted, self.inventory, fence)
        if not isinstance(placed, Refusal):
            return placed
        if placed.never:
            db.execute("DELETE FROM waiting WHERE gang_id = ?", (request.gang_id,))
            return placed
        if held_nodes:
            anywhere = place(wanted, self.inventory, used)
            if not isinstance(anywhere, Refusal):
                return self._refuse(db, request, now, self._on_held_nodes(ahead, now))
            placed = anywhere  # it does not fit at all: say so with every node
        if self.teams is not None:
            evicting = self._make_room(db, request, view, now, used, held_nodes=held_nodes)
            if evicting:
                return self._refuse(db, request, now, evicting)
        self._wait(db, request, now, placed.reason)
        return Refusal(placed.reason + self._held_by(db, request.device_class, now), never=False)

    # -- waiting, reservation and eviction (teams) -------------------------------------
    def _refuse(
        self, db: sqlite3.Connection, request: GangRequest, now: float, reason: str
    ) -> Refusal:
        self._wait(db, request, now, reason)
        return Refusal(reason, never=False)

    def _wait(
        self, db: sqlite3.Connection, request: GangRequest, now: float, reason: str = ""
    ) -> None:
        before = db.execute(
            "SELECT reason FROM waiting WHERE gang_id = ?", (request.gang_id,)
        ).fetchone()
        db.execute(
            "INSERT INTO waiting (gang_id, request, priority, enqueued_at, last_seen, reason) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(gang_id) DO UPDATE SET "
            "request = excluded.request, priority = excluded.priority, last_seen = ?, "
            "reason = excluded.reason",
            (request.gang_id, request.to_json(), request.priority, now, now, reason, now),
        )
        # The journal records why a gang waits when the reason changes, not every poll.
        # (numbers such as "waited 1830s" change every poll: they do not make a new reason)
        if self.teams is not None and (before is None or _shape(before[0]) != _shape(reason)):
            self._journal(db, now, request, "wait", reason)

    def _journal(
        self, db: sqlite3.Connection, now: float, request: GangRequest, action: str, reason: str
    ) -> None:
        self._journal_gang(db, now, request.gang_id, request.team, action, reason)

    @staticmethod
    def _journal_gang(  # noqa: PLR0917 (one journal row's fields)
        db: sqlite3.Connection, now: float, gang_id: str, team: str, action: str, reason: str
    ) -> None:
        db.execute(
            "INSERT INTO journal (at, gang_id, team, action, reason) VALUES (?, ?, ?, ?, ?)",
            (now, gang_id, team, action, reason),
        )

    def _view(self, db: sqlite3.Connection) -> _View:
        """Every lease and waiting request, as the quota policy sees them."""
        evicting = {str(g) for (g,) in db.execute("SELECT gang_id FROM evictions")}
        held = _cached_held if PARSE_CACHE else _parse_held
        pairs = [
            held(row, str(row[1]) in evicting)
            for row in db.execute(f"SELECT {_LEASE_COLUMNS} FROM leases").fetchall()
        ]
        # in the table's order (a scan, as _waiter_ahead's query read it): queue_order's
        # sort is stable, so the order of equal waiters is this one
        rows = db.execute("SELECT request, enqueued_at FROM waiting ORDER BY rowid").fetchall()
        parse = _cached_request if PARSE_CACHE else GangRequest.from_json
        return _View(
            tuple(h for _, h in pairs),
            tuple(lease for lease, _ in pairs),
            tuple(parse(r) for r, _ in rows),
            tuple(float(t) for _, t in rows),
        )

    def _at_risk(self, view: _View, now: float) -> tuple[Held, ...]:
        """The view's leases with their work at risk (what eviction orders by)."""
        return tuple(
            replace(held, work_at_risk_s=self.work_at_risk(lease, now))
            for held, lease in zip(view.held, view.leases, strict=True)
        )

    def _reservations(
        self,
        db: sqlite3.Connection,
        device_class: str,
        view: _View,
        used: dict[str, set[int]],
        now: float,
    ) -> list[Reservation]:
        """The gangs that have waited past ``reserve_after`` on this class, and the nodes
        held for each (``tideflow.scheduling.reservation``)."""
        assert self.teams is not None
        limit = self.teams.reserve_after_s
        if limit is None or not any(at <= now - limit for at in view.enqueued_at):
            return []
        claims = [
            Claim(str(node), str(lease_id), float(at), int(priority), bool(preemptible))
            for node, lease_id, at, priority, preemptible in db.execute(
                "SELECT c.node, c.lease_id, l.acquired_at, l.priority, l.preemptible "
                "FROM claims c JOIN leases l USING (lease_id) WHERE c.device_class = ? "
                "ORDER BY c.node",
                (device_class,),
            )
        ]
        return reservations(
            self.teams,
            self.inventory,
            device_class,
            waiting=list(zip(view.waiting, view.enqueued_at, strict=True)),
            held=view.held,
            used=used,
            claims=claims,
            now=now,
        )

    @staticmethod
    def _queued_at(request: GangRequest, view: _View, now: float) -> float:
        for other, at in zip(view.waiting, view.enqueued_at, strict=True):
            if other.gang_id == request.gang_id:
                return at
        return now

    def _held_back(
        self,
        request: GangRequest,
        grant: Grant,
        ahead: list[Reservation],
        view: _View,
        now: float,
    ) -> str | None:
        """Why ``request`` may not start although its quota admits it: it would take
        quota that a reserved gang ahead of it needs."""
        assert self.teams is not None
        if not ahead:
            return None
        blocked = quota_held_back(
            self.teams, request, grant, ahead=ahead, held=view.held, waiting=view.waiting, now=now
        )
        if blocked is None:
            return None
        return (
            f"quota of class {request.device_class} is "
            f"{blocked.describe(now, self.teams.reserve_after_s or 0)}: it would no longer be "
            "admitted with this gang running; gangs of its priority or lower start after it"
        )

    def _on_held_nodes(self, ahead: list[Reservation], now: float) -> str:
        assert self.teams is not None
        limit = self.teams.reserve_after_s or 0
        held = "; ".join(f"{', '.join(r.nodes)} {r.describe(now, limit)}" for r in ahead if r.nodes)
        return (
            f"fits only on nodes held for a gang ahead of it: {held}; "
            "gangs of its priority or lower start on the other nodes"
        )

    def _make_room(
        self,
        db: sqlite3.Connection,
        request: GangRequest,
        view: _View,
        now: float,
        used: dict[str, set[int]] | None = None,
        *,
        held_nodes: frozenset[str] = frozenset(),
    ) -> str | None:
        """Ask the gangs in the way to stop (checkpoint first); say whom it waits for.
        Stopping gangs on ``held_nodes`` (held for a reserved gang ahead) does not help."""
        assert self.teams is not None
        pending = db.execute(
            "SELECT gang_id, deadline FROM evictions WHERE by_gang = ?", (request.gang_id,)
        ).fetchall()
        if pending:
            names = ", ".join(
                f"{g} (grace ends in {max(0.0, float(d) - now):.0f}s)" for g, d in pending
            )
            return f"waiting for {names} to checkpoint and stop"
        teams = self.teams
        if not candidates(teams, request, view.held, now=now):
            return None  # nobody it may stop: no need to work out whether that would help
        held, waiting = self._at_risk(view, now), view.waiting
        if used is None:
            used = self._used(db, request.device_class)
        claims: dict[str, list[tuple[str, int]]] = {}
        for gang_id, node, device in db.execute(
            "SELECT l.gang_id, c.node, c.device FROM claims c JOIN leases l USING (lease_id) "
            "WHERE c.device_class = ?",
            (request.device_class,),
        ):
            claims.setdefault(str(gang_id), []).append((str(node), int(device)))

        in_use = used

        def fits_without(gangs: frozenset[str]) -> bool:
            rest = [h for h in held if h.gang_id not in gangs]
            quota = admit(teams, request, rest, waiting)
            if not isinstance(quota, Grant):
                return False
            free = {node: set(devices) for node, devices in in_use.items()}
            for gang in gangs:
                for node, device in claims.get(gang, ()):
                    free[node].discard(device)
            if held_nodes:
                free = without_nodes(self.inventory, free, held_nodes, request.device_class)
            return not isinstance(place(shrink_to(request, quota), self.inventory, free), Refusal)

        chosen = victims(teams, request, held, now=now, fits_without=fits_without)
        if not chosen:
            return None
        teams_of = {h.gang_id: h.team for h in held}
        for eviction in chosen:
            db.execute(
                "INSERT OR IGNORE INTO evictions VALUES (?, ?, ?, ?, ?, 0)",
                (eviction.gang_id, request.gang_id, eviction.reason, now, now + eviction.grace_s),
            )
            self._journal_gang(
                db,
                now,
                eviction.gang_id,
                teams_of.get(eviction.gang_id, ""),
                "evict",
                eviction.reason,
            )
        names = ", ".join(e.gang_id for e in chosen)
        return f"stopping {names} (checkpoint first) to make room: {chosen[0].reason}"

    def _waiter_ahead(
        self,
        db: sqlite3.Connection,
        request: GangRequest,
        used: dict[str, set[int]],
        view: _View,
        now: float,
        *,
        booked: list[Reservation] | None = None,
    ) -> str | None:
        queued_at = now
        waiting: list[tuple[GangRequest, float]] = []
        if self.teams is not None:  # the waiting table as try_acquire read it
            for other, at in zip(view.waiting, view.enqueued_at, strict=True):
                if other.gang_id == request.gang_id:
                    queued_at = at
                elif other.priority >= request.priority:
                    waiting.append((other, at))
        else:
            mine = db.execute(
                "SELECT enqueued_at FROM waiting WHERE gang_id = ?", (request.gang_id,)
            ).fetchone()
            queued_at = float(mine[0]) if mine else now
            waiting = [
                (_request(r), float(t))
                for r, t in db.execute(
                    "SELECT request, enqueued_at FROM waiting WHERE gang_id != ? AND priority >= ?",
                    (request.gang_id, request.priority),
                )
            ]
        if not waiting:
            return None
        # as try_acquire does: a lender's own waiting gangs are demand it does not lend
        held, demand = view.held, view.waiting
        # the asking gang first: on a tie it keeps its place (the sort is stable)
        order = queue_order(self.teams, [(request, queued_at), *waiting], held)
        for other, at in order:
            if other.gang_id == request.gang_id:
                return None  # everyone after it in the queue waits behind it
            candidate, granted = other, None
            if self.teams is not None:
                quota = admit(self.teams, other, held, demand)
                if not isinstance(quota, Grant):
                    continue
                candidate, granted = shrink_to(other, quota), quota
            other_used = (
                used
                if other.device_class == request.device_class
                else self._used(db, other.device_class)
            )
            # A waiter that a reservation holds back (booked: on the asking gang's class)
            # is not about to start, or only off the held nodes.
            ahead = [r for r in booked or () if r.ahead_of(other, at)]
            if ahead and granted is not None and other.device_class == request.device_class:
                if self._held_back(other, granted, ahead, view, now) is not None:
                    continue
                fenced = {node for r in ahead for node in r.nodes}
                other_used = without_nodes(self.inventory, other_used, fenced, other.device_class)
            if not isinstance(place(candidate, self.inventory, other_used), Refusal):
                return other.gang_id
        return None

    def _held_by(self, db: sqlite3.Connection, device_class: str, now: float) -> str:
        """Who holds the devices of ``device_class``: what a waiting gang's message names."""
        rows = db.execute(
            f"SELECT {_LEASE_COLUMNS} FROM leases WHERE device_class = ? ORDER BY acquired_at",
            (device_class,),
        ).fetchall()
        held = [
            f"{lease.gang_id} (team {lease.team}, {sum(len(p.devices) for p in lease.placements)}"
            f" device(s), holder {lease.holder}, for {now - lease.acquired_at:.0f}s)"
            for lease in map(self._lease, rows)
        ]
        return f"; held by {', '.join(held)}" if held else ""

    def forget(self, gang_id: str) -> None:
        """Drop a queued request (its owner found other devices, or gave up), and the
        evictions made for it that nobody has carried out yet (a gang already asked
        to stop goes on stopping; it requeues and resumes from its checkpoint)."""
        with self._transaction() as db:
            db.execute("DELETE FROM waiting WHERE gang_id = ?", (gang_id,))
            db.execute("DELETE FROM evictions WHERE by_gang = ? AND signalled = 0", (gang_id,))

    def renew(self, lease_id: str, ttl_s: float) -> Lease:
        with self._transaction() as db:
            now = self.clock()
            self._expire(db, now)
            updated = db.execute(
                "UPDATE leases SET expires_at = ? WHERE lease_id = ?", (now + ttl_s, lease_id)
            ).rowcount
            if updated == 0:
                raise LeaseLostError(f"lease {lease_id} expired or was released")
            row = db.execute(
                f"SELECT {_LEASE_COLUMNS} FROM leases WHERE lease_id = ?", (lease_id,)
            ).fetchone()
            return self._lease(row)

    def release(self, lease_id: str, *, lost_s: float = 0.0) -> None:
        """Give a lease's devices back. A gang the ledger asked to stop ends 'preempted'
        (its eviction is done); ``lost_s`` is the work since its last checkpoint that a
        forced stop threw away."""
        with self._transaction() as db:
            now = self.clock()
            row = db.execute(
                f"SELECT {_LEASE_COLUMNS} FROM leases WHERE lease_id = ?", (lease_id,)
            ).fetchone()
            if row is not None:
                lease = self._lease(row)
                evicted = db.execute(
                    "DELETE FROM evictions WHERE gang_id = ?", (lease.gang_id,)
                ).rowcount
                how = "released"
                if evicted:
                    how = "forced" if lost_s > 0 else "preempted"
                    self._journal_gang(
                        db,
                        now,
                        lease.gang_id,
                        lease.team,
                        how,
                        f"{lease.devices} device(s) freed"
                        + (f"; {lost_s:.0f}s of work since its checkpoint lost" if lost_s else ""),
                    )
                self._record_usage(db, lease, now, how, lost_s)
            db.execute("DELETE FROM leases WHERE lease_id = ?", (lease_id,))

    # -- evictions: carried out by the gang layer, which can signal gangs --------------------
    def evictions(self) -> list[EvictionRecord]:
        with self._transaction() as db:
            self._expire(db, self.clock())
            rows = db.execute(
                "SELECT gang_id, by_gang, reason, requested_at, deadline, signalled "
                "FROM evictions ORDER BY requested_at"
            ).fetchall()
        return [
            EvictionRecord(str(g), str(b), str(r), float(a), float(d), bool(s))
            for g, b, r, a, d, s in rows
        ]

    def evict(
        self, gang_id: str, by_gang: str, reason: str, grace_s: float, *, signalled: bool = False
    ) -> bool:
        """Record that ``gang_id`` must stop within ``grace_s`` for ``by_gang``, decided
        outside this ledger's admission (the broker growing inference when inference is
        no team of the cluster file), so that its stop is journaled and accounted as a
        preemption like the ledger's own. False when the gang holds no lease."""
        with self._transaction() as db:
            now = self.clock()
            row = db.execute("SELECT team FROM leases WHERE gang_id = ?", (gang_id,)).fetchone()
            if row is None:
                return False
            db.execute(
                "INSERT OR IGNORE INTO evictions VALUES (?, ?, ?, ?, ?, ?)",
                (gang_id, by_gang, reason, now, now + grace_s, int(signalled)),
            )
            self._journal_gang(db, now, gang_id, str(row[0]), "evict", reason)
            return True

    def mark_signalled(self, gang_id: str) -> None:
        with self._transaction() as db:
            db.execute("UPDATE evictions SET signalled = 1 WHERE gang_id = ?", (gang_id,))

    def journal(
        self, since: float = 0.0, limit: int = 200, *, actions: Collection[str] | None = None
    ) -> list[JournalEntry]:
        """The teams' scheduling decisions, newest last: the last ``limit`` since
        ``since``, of the ``actions`` named (all when None)."""
        where = "at >= ?"
        params: list[object] = [since]
        if actions is not None:
            chosen = sorted(set(actions))
            if not chosen:
                return []
            where += f" AND action IN ({', '.join('?' * len(chosen))})"
            params += chosen
        with self._transaction() as db:
            rows = db.execute(
                "SELECT at, gang_id, team, action, reason FROM journal "
                f"WHERE {where} ORDER BY seq DESC LIMIT ?",
                (*params, limit),
            ).fetchall()
        return [
            JournalEntry(float(a), str(g), str(t), str(x), str(r))
            for a, g, t, x, r in reversed(rows)
        ]

    def waiting_reasons(self) -> dict[str, str]:
        with self._transaction() as db:
            self._expire(db, self.clock())
            return {str(g): str(r) for g, r in db.execute("SELECT gang_id, reason FROM waiting")}

    def _placed_model(self, lease: Lease) -> str | None:
        """The model of the devices a lease holds: the one its gang asked for, else its
        nodes' in this process's inventory (a gang never mixes models); None on the CPU."""
        if lease.model is not None or lease.device_class == "cpu" or not lease.placements:
            return lease.model
        first = lease.placements[0].node
        return next((n.model for n in self.inventory.nodes if n.name == first), None)

    def _granted_model(self, db: sqlite3.Connection, lease: Lease) -> str | None:
        """The model recorded when the lease was placed (by the process that placed it:
        a reader opened with another inventory, which may end the lease, does not know
        its nodes), else what this process's inventory says."""
        row = db.execute(
            "SELECT granted_model FROM leases WHERE lease_id = ?", (lease.lease_id,)
        ).fetchone()
        if row is not None and row[0] is not None:
            return str(row[0])
        return self._placed_model(lease)

    def _record_usage(
        self,
        db: sqlite3.Connection,
        lease: Lease,
        ended_at: float,
        how: str,
        lost_s: float = 0.0,
    ) -> None:
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
                self._granted_model(db, lease),
            ),
        )

    def usage_spans(self, since: float, until: float | None = None) -> list[UsageSpan]:
        """Every lease that overlapped [since, until], clipped to it: ended ones from the
        usage journal, held ones up to ``until`` (default: now). The raw material of
        accounting (``tideflow.scheduling.accounting``)."""
        with self._transaction() as db:
            now = self.clock()
            self._expire(db, now)
            end = now if until is None else until
            rows = db.execute(
                "SELECT gang_id, team, device_class, devices, borrowed, started_at, ended_at, "
                "ended_by, lost_device_s, model FROM usage WHERE ended_at > ? AND started_at < ?",
                (since, end),
            ).fetchall()
            spans = [
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
                for g, t, c, n, b, a, z, how, lost, model in rows
            ]
            for row in db.execute(
                f"SELECT {_LEASE_COLUMNS} FROM leases WHERE acquired_at < ?", (end,)
            ).fetchall():
                lease = self._lease(row)
                spans.append(
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
                        self._granted_model(db, lease),
                    )
                )
        return [span.clipped(since, end) for span in spans]

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
            for row in db.execute(
                f"SELECT {_LEASE_COLUMNS} FROM leases WHERE acquired_at < ?", (end,)
            ):
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
            row = db.execute(
                f"SELECT {_LEASE_COLUMNS} FROM leases WHERE gang_id = ?", (gang_id,)
            ).fetchone()
            return None if row is None else self._lease(row)

    def leases(self) -> list[Lease]:
        with self._transaction() as db:
            self._expire(db, self.clock())
            rows = db.execute(
                f"SELECT {_LEASE_COLUMNS} FROM leases ORDER BY acquired_at"
            ).fetchall()
            return [self._lease(row) for row in rows]

    def waiting(self) -> list[tuple[GangRequest, float]]:
        with self._transaction() as db:
            self._expire(db, self.clock())
            rows = db.execute(
                "SELECT request, enqueued_at FROM waiting ORDER BY priority DESC, enqueued_at"
            ).fetchall()
            return [(_request(r), float(t)) for r, t in rows]

    def used_devices(self, device_class: str | None = None) -> dict[str, set[int]]:
        with self._transaction() as db:
            self._expire(db, self.clock())
            if device_class is not None:
                return self._used(db, device_class)
            used: dict[str, set[int]] = {}
            for node, cls, device in db.execute("SELECT node, device_class, device FROM claims"):
                used.setdefault(f"{node}/{cls}", set()).add(int(device))
            return used


__all__ = [
    "EvictionRecord",
    "JournalEntry",
    "LeaseLedger",
    "LeaseLostError",
    "UsageSpan",
    "WorkerPlacement",
]
