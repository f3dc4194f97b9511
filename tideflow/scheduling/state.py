"""The lease ledger's state: one SQLite file shared by many processes.

Every Airflow task process, the triggerer and the gang supervisors open the
same file. Each operation is one ``BEGIN IMMEDIATE`` transaction (one writer at
a time, WAL so readers do not block), and the database itself refuses to book a
device twice: ``claims`` has one row per (node, device) with that pair as its
primary key. A bug in placement would surface as an integrity error, never as
two gangs on one GPU.

Every process must place against the same inventory: two processes that name
one 8-GPU box differently would each see 8 free GPUs. The ledger keeps the
fingerprint of the inventory it last placed with; a process whose inventory
differs may place a gang only if every held claim is on a device its own
inventory has (a node added, say), and its inventory then becomes the ledger's.
Otherwise placing is refused with ``InventoryChangedError``, naming the claims
it cannot account for. Reading the ledger needs no inventory check.

The tables' rows as the scheduler's types (``Lease``, ``Held``, ``GangRequest``)
are parsed here, each stored text once (``PARSE_CACHE``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from tideflow.inventory import Inventory
from tideflow.scheduling.model import GangRequest, Lease
from tideflow.scheduling.teams import Held
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
LEASE_COLUMNS = (
    "lease_id, gang_id, holder, team, device_class, model, placements, priority, "
    "preemptible, acquired_at, expires_at, min_workers, borrowed, lender, priority_class"
)


class InventoryChangedError(Exception):
    """Held leases are on devices this process's inventory does not have."""


def create(path: Path) -> None:
    """The ledger's tables, made or brought up to date (a file an older tideflow wrote)."""
    setup = sqlite3.connect(path, timeout=30)
    try:
        setup.execute("PRAGMA journal_mode=WAL")
        setup.executescript(_SCHEMA)
        add_missing_columns(setup, _ADDED_COLUMNS)
    finally:
        setup.close()


@contextlib.contextmanager
def transaction(path: Path) -> Iterator[sqlite3.Connection]:
    """One ``BEGIN IMMEDIATE`` transaction: committed when the block ends, else rolled back."""
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
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


# -- the inventory every process places against ---------------------------------------
def inventory_fingerprint(inventory: Inventory) -> str:
    text = repr(
        sorted((n.name, n.device_class, n.model, n.devices, n.cpu) for n in inventory.nodes)
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def adopt_inventory(
    db: sqlite3.Connection, path: Path, inventory: Inventory, fingerprint: str
) -> None:
    """Record ``inventory`` (its ``fingerprint``) as the ledger's, if the held claims
    allow it."""
    stored = db.execute("SELECT value FROM meta WHERE key = 'inventory'").fetchone()
    if stored is not None and stored[0] == fingerprint:
        return
    unknown = [
        (node, device_class, device, gang)
        for node, device_class, device, gang in db.execute(
            "SELECT c.node, c.device_class, c.device, l.gang_id "
            "FROM claims c JOIN leases l USING (lease_id) ORDER BY c.node, c.device"
        )
        if not _has_device(inventory, str(node), str(device_class), int(device))
    ]
    if unknown:
        shown = "; ".join(
            f"{node} {cls} {device} (gang {gang})" for node, cls, device, gang in unknown[:5]
        )
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        nodes = ", ".join(sorted(n.name for n in inventory.nodes))
        raise InventoryChangedError(
            f"lease ledger {path}: the inventory changed under held leases; "
            f"{len(unknown)} held claim(s) are on devices this process's inventory "
            f"'{inventory.name}' (nodes: {nodes}) does not have: {shown}{more}. "
            "Every process must use the same cluster file (TIDEFLOW_CLUSTER_FILE); "
            "or wait until those gangs end, then the new inventory takes over"
        )
    db.execute("INSERT OR REPLACE INTO meta VALUES ('inventory', ?)", (fingerprint,))


def _has_device(inventory: Inventory, node_name: str, device_class: str, device: int) -> bool:
    node = next((n for n in inventory.nodes if n.name == node_name), None)
    if node is None or device_class not in ("cpu", node.device_class):
        return False
    offered = node.cpu if device_class == "cpu" else node.devices
    return 0 <= device < offered


# -- rows, parsed ---------------------------------------------------------------------
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


def parse_request(text: object) -> GangRequest:
    """A stored request (the ``waiting`` table's JSON), parsed."""
    return _cached_request(str(text)) if PARSE_CACHE else GangRequest.from_json(str(text))


def _parse_lease(row: tuple[object, ...]) -> Lease:
    """A ``leases`` row (``LEASE_COLUMNS``), as a lease."""
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
    eviction orders by it: ``LedgerSnapshot.at_risk`` fills it in then)."""
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


def parse_lease(row: tuple[object, ...]) -> Lease:
    return _cached_lease(row) if PARSE_CACHE else _parse_lease(row)


def parse_held(row: tuple[object, ...], evicting: bool) -> tuple[Lease, Held]:
    return _cached_held(row, evicting) if PARSE_CACHE else _parse_held(row, evicting)


# -- leases and the queue -------------------------------------------------------------
def lease_where(db: sqlite3.Connection, column: str, value: str) -> Lease | None:
    """The lease whose ``column`` (gang_id or lease_id) is ``value``, if any."""
    row = db.execute(f"SELECT {LEASE_COLUMNS} FROM leases WHERE {column} = ?", (value,)).fetchone()
    return None if row is None else parse_lease(row)


def insert_lease(db: sqlite3.Connection, lease: Lease, granted_model: str | None) -> None:
    """The lease and one claim per device it holds (the primary key refuses a double)."""
    db.execute(
        f"INSERT INTO leases ({LEASE_COLUMNS}) VALUES "
        "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            lease.lease_id,
            lease.gang_id,
            lease.holder,
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
        "UPDATE leases SET granted_model = ? WHERE lease_id = ?", (granted_model, lease.lease_id)
    )
    db.executemany(
        "INSERT INTO claims VALUES (?, ?, ?, ?)",
        [
            (p.node, lease.device_class, device, lease.lease_id)
            for p in lease.placements
            for device in p.devices
        ],
    )


def used(db: sqlite3.Connection, device_class: str) -> dict[str, set[int]]:
    """The claimed devices of ``device_class``, per node."""
    found: dict[str, set[int]] = {}
    for node, device in db.execute(
        "SELECT node, device FROM claims WHERE device_class = ?", (device_class,)
    ):
        found.setdefault(node, set()).add(device)  # TEXT and INTEGER columns
    return found


def enqueue(db: sqlite3.Connection, request: GangRequest, now: float, reason: str) -> str | None:
    """Queue ``request`` (or mark it seen) with why it waits; the reason it had before
    (None: it was not queued)."""
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
    return None if before is None else str(before[0])


def dequeue(db: sqlite3.Connection, gang_id: str) -> None:
    db.execute("DELETE FROM waiting WHERE gang_id = ?", (gang_id,))
