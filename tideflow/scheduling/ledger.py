"""The lease ledger: all-or-nothing device reservations shared by many processes.

``LeaseLedger`` is the one way in. Its state is one SQLite file
(``tideflow.scheduling.state``: one transaction per operation, the database
refusing to book a device twice, the inventory every process places against).
``try_acquire`` works as Kueue's scheduler does on its cache: it reads one
snapshot (``snapshot``), runs the admission steps on it (``admission``: quota,
reservations, placement, room, the queue) and writes their one result: a lease,
or the gang queued with why it waits and the gangs asked to stop for it
(``evictions``). The teams' decisions are journaled (``journal``) and every
lease's time on its devices is recorded for accounting (``usage``).

Waiting and priority: a request that does not fit now is recorded in
``waiting`` without holding anything. A request that fits is still refused
while a waiter of higher priority (or equal priority, queued earlier) would
also fit now: that waiter goes first. Waiters that do not fit do not block
smaller requests behind them (best-effort FIFO, as Kueue's BestEffortFIFO).
So that a large gang cannot starve behind a stream of small ones, a gang that
has waited ``scheduling.reserve_after`` holds the nodes where it can start
soonest (and the quota it needs): gangs behind it start on the other nodes
(``tideflow.scheduling.reservation``).

Leases expire unless renewed (the holder died); waiters that stop polling
are forgotten. Both are cleaned inside every transaction, using the injected
clock so tests can replay time.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Collection
from dataclasses import replace
from pathlib import Path

from tideflow.inventory import Inventory
from tideflow.scheduling import admission, evictions, journal, snapshot, state, usage
from tideflow.scheduling.journal import LedgerEvent
from tideflow.scheduling.model import DeviceUsage, GangRequest, Lease, Refusal, WorkerPlacement
from tideflow.scheduling.preemption import Eviction
from tideflow.scheduling.state import InventoryChangedError, inventory_fingerprint
from tideflow.scheduling.teams import Teams
from tideflow.scheduling.usage import UsageSpan


class LeaseLostError(Exception):
    """The lease expired, was released, or was taken back (e.g. by the broker)."""


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
        state.create(self.path)  # a ledger written by an older tideflow gets its new columns
        # Checked when this process places a gang (try_acquire), not here: readers
        # (the tideflow page, the broker's view of leases) may open the ledger with
        # whatever inventory they were started with.
        self.fingerprint = inventory_fingerprint(inventory)

    def _expire(self, db: sqlite3.Connection, now: float) -> None:
        # A lease nobody renewed counts as held until it expired: that is when
        # its devices became free for others.
        expired = db.execute(
            f"SELECT {state.LEASE_COLUMNS} FROM leases WHERE expires_at <= ?", (now,)
        ).fetchall()
        for row in expired:
            lease = state.parse_lease(row)
            usage.record(db, self.inventory, lease, lease.expires_at, "expired")
        if expired:
            db.execute("DELETE FROM leases WHERE expires_at <= ?", (now,))
        db.execute("DELETE FROM waiting WHERE last_seen < ?", (now - self.waiter_timeout_s,))
        db.execute("DELETE FROM evictions WHERE gang_id NOT IN (SELECT gang_id FROM leases)")

    # -- admission -------------------------------------------------------------------
    def try_acquire(self, request: GangRequest, holder: str, ttl_s: float) -> Lease | Refusal:
        with state.transaction(self.path) as db:
            now = self.clock()
            self._expire(db, now)
            # another process may have placed with another inventory
            state.adopt_inventory(db, self.path, self.inventory, self.fingerprint)
            held = state.lease_where(db, "gang_id", request.gang_id)
            if held is not None:  # idempotent: the gang already holds its devices
                db.execute(
                    "UPDATE leases SET expires_at = MAX(expires_at, ?) WHERE gang_id = ?",
                    (now + ttl_s, request.gang_id),
                )
                return replace(held, expires_at=max(held.expires_at, now + ttl_s))
            snap = snapshot.read(db, self.inventory, self.teams)
            outcome = admission.decide(snap, request, now, self.work_at_risk)
            if isinstance(outcome, admission.Waits):
                return self._not_now(db, request, now, outcome)
            lease = outcome.lease(request, holder, now, ttl_s)
            state.insert_lease(db, lease, usage.placed_model(self.inventory, lease))
            state.dequeue(db, request.gang_id)
            # Started without them after all: gangs not yet asked to stop for it keep running.
            evictions.withdraw(db, request.gang_id)
            if self.teams is not None:
                source = (
                    f", {lease.borrowed} borrowed from "
                    + ("the shared pool" if lease.lender == "" else str(lease.lender))
                    if lease.borrowed
                    else ""
                )
                self._journal(db, now, request, "admit", f"{lease.devices} device(s){source}")
            return lease

    def _not_now(
        self, db: sqlite3.Connection, request: GangRequest, now: float, outcome: admission.Waits
    ) -> Refusal:
        """Write a gang's refusal: out of the queue for good, or queued with why (after
        asking the gangs in its way to stop)."""
        if outcome.never:
            state.dequeue(db, request.gang_id)
            if outcome.journaled:
                self._journal(db, now, request, "refuse", outcome.reason)
            return Refusal(outcome.reason, never=True)
        for eviction in outcome.evictions:
            evictions.ask_to_stop(
                db, eviction.gang_id, request.gang_id, eviction.reason, now, eviction.grace_s
            )
        before = state.enqueue(db, request, now, outcome.reason)
        if self.teams is not None and journal.new_reason(before, outcome.reason):
            self._journal(db, now, request, "wait", outcome.reason)
        holders = self._held_by(db, request.device_class, now) if outcome.name_holders else ""
        return Refusal(outcome.reason + holders, never=False)

    def _journal(
        self, db: sqlite3.Connection, now: float, request: GangRequest, action: str, reason: str
    ) -> None:
        journal.write(db, now, request.gang_id, request.team, action, reason)

    def _held_by(self, db: sqlite3.Connection, device_class: str, now: float) -> str:
        """Who holds the devices of ``device_class``: what a waiting gang's message names."""
        rows = db.execute(
            f"SELECT {state.LEASE_COLUMNS} FROM leases WHERE device_class = ? ORDER BY acquired_at",
            (device_class,),
        ).fetchall()
        held = [
            f"{lease.gang_id} (team {lease.team}, {lease.devices}"
            f" device(s), holder {lease.holder}, for {now - lease.acquired_at:.0f}s)"
            for lease in map(state.parse_lease, rows)
        ]
        return f"; held by {', '.join(held)}" if held else ""

    def forget(self, gang_id: str) -> None:
        """Drop a queued request (its owner found other devices, or gave up), and the
        evictions made for it that nobody has carried out yet (a gang already asked
        to stop goes on stopping; it requeues and resumes from its checkpoint)."""
        with state.transaction(self.path) as db:
            state.dequeue(db, gang_id)
            evictions.withdraw(db, gang_id)

    # -- leases ----------------------------------------------------------------------
    def renew(self, lease_id: str, ttl_s: float) -> Lease:
        with state.transaction(self.path) as db:
            now = self.clock()
            self._expire(db, now)
            updated = db.execute(
                "UPDATE leases SET expires_at = ? WHERE lease_id = ?", (now + ttl_s, lease_id)
            ).rowcount
            lease = state.lease_where(db, "lease_id", lease_id) if updated else None
            if lease is None:
                raise LeaseLostError(f"lease {lease_id} expired or was released")
            return lease

    def release(self, lease_id: str, *, lost_s: float = 0.0) -> None:
        """Give a lease's devices back. A gang the ledger asked to stop ends 'preempted'
        (its eviction is done); ``lost_s`` is the work since its last checkpoint that a
        forced stop threw away."""
        with state.transaction(self.path) as db:
            now = self.clock()
            lease = state.lease_where(db, "lease_id", lease_id)
            if lease is not None:
                how = "released"
                if evictions.done(db, lease.gang_id):
                    how = "forced" if lost_s > 0 else "preempted"
                    lost = f"; {lost_s:.0f}s of work since its checkpoint lost" if lost_s else ""
                    freed = f"{lease.devices} device(s) freed{lost}"
                    journal.write(db, now, lease.gang_id, lease.team, how, freed)
                usage.record(db, self.inventory, lease, now, how, lost_s)
            db.execute("DELETE FROM leases WHERE lease_id = ?", (lease_id,))

    def lease_for(self, gang_id: str) -> Lease | None:
        with state.transaction(self.path) as db:
            self._expire(db, self.clock())
            return state.lease_where(db, "gang_id", gang_id)

    def leases(self) -> list[Lease]:
        with state.transaction(self.path) as db:
            self._expire(db, self.clock())
            rows = db.execute(
                f"SELECT {state.LEASE_COLUMNS} FROM leases ORDER BY acquired_at"
            ).fetchall()
            return [state.parse_lease(row) for row in rows]

    def waiting(self) -> list[tuple[GangRequest, float]]:
        with state.transaction(self.path) as db:
            self._expire(db, self.clock())
            rows = db.execute(
                "SELECT request, enqueued_at FROM waiting ORDER BY priority DESC, enqueued_at"
            ).fetchall()
            return [(state.parse_request(r), float(t)) for r, t in rows]

    def waiting_reasons(self) -> dict[str, str]:
        with state.transaction(self.path) as db:
            self._expire(db, self.clock())
            return {str(g): str(r) for g, r in db.execute("SELECT gang_id, reason FROM waiting")}

    def used_devices(self, device_class: str | None = None) -> dict[str, set[int]]:
        with state.transaction(self.path) as db:
            self._expire(db, self.clock())
            if device_class is not None:
                return state.used(db, device_class)
            used: dict[str, set[int]] = {}
            for node, cls, device in db.execute("SELECT node, device_class, device FROM claims"):
                used.setdefault(f"{node}/{cls}", set()).add(int(device))
            return used

    # -- evictions: carried out by the gang layer, which can signal gangs --------------------
    def evictions(self) -> list[Eviction]:
        with state.transaction(self.path) as db:
            self._expire(db, self.clock())
            return evictions.listed(db)

    def evict(
        self, gang_id: str, by_gang: str, reason: str, grace_s: float, *, signalled: bool = False
    ) -> bool:
        """Record that ``gang_id`` must stop within ``grace_s`` for ``by_gang``, decided
        outside this ledger's admission (the broker growing inference when inference is
        no team of the cluster file), so that its stop is journaled and accounted as a
        preemption like the ledger's own. False when the gang holds no lease."""
        with state.transaction(self.path) as db:
            now = self.clock()
            return evictions.ask_to_stop(
                db, gang_id, by_gang, reason, now, grace_s, signalled=signalled
            )

    def mark_signalled(self, gang_id: str) -> None:
        with state.transaction(self.path) as db:
            db.execute("UPDATE evictions SET signalled = 1 WHERE gang_id = ?", (gang_id,))

    # -- the journal and usage -----------------------------------------------------------
    def journal(
        self, since: float = 0.0, limit: int = 200, *, actions: Collection[str] | None = None
    ) -> list[LedgerEvent]:
        """The teams' scheduling decisions, newest last: the last ``limit`` since
        ``since``, of the ``actions`` named (all when None)."""
        with state.transaction(self.path) as db:
            return journal.read(db, since, limit, actions)

    def usage_spans(self, since: float, until: float | None = None) -> list[UsageSpan]:
        """Every lease that overlapped [since, until], clipped to it: ended ones from the
        usage journal, held ones up to ``until`` (default: now). The raw material of
        accounting (``tideflow.scheduling.accounting``)."""
        with state.transaction(self.path) as db:
            now = self.clock()
            self._expire(db, now)
            end = now if until is None else until
            spans = usage.spans(db, self.inventory, since, end)
        return [span.clipped(since, end) for span in spans]

    def device_hours(self, since: float, until: float | None = None) -> list[DeviceUsage]:
        """Device-hours held per (team, device class) within [since, until].

        Ended leases come from the usage journal; leases still held count up to
        ``until`` (default: now). Only the part of each lease inside the window
        is counted.
        """
        return usage.device_hours(self.usage_spans(since, until))


__all__ = [
    "Eviction",
    "InventoryChangedError",
    "LeaseLedger",
    "LeaseLostError",
    "LedgerEvent",
    "UsageSpan",
    "WorkerPlacement",
    "inventory_fingerprint",
]
