"""The broker's decision journal (SQLite): every decision with its inputs and reason.

It is the audit trail ("why did my gang stop at 14:02?"), the replay input for
the pure policy, and the data of the timeline on the tideflow page.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tideflow.broker.calibrate import TrainingWork
from tideflow.broker.policy import BrokerDecision
from tideflow.storage.sqlite_columns import add_missing_columns

# How long the journal remembers a workload the queue no longer lists: well past the
# lost-work budget's span (a week), so every preemption the budget weighs is kept.
PREEMPTIONS_KEPT_S = 30 * 86400.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS decisions (
    at_s REAL NOT NULL,
    action TEXT NOT NULL,
    inference_gpus INTEGER NOT NULL,
    total_gpus INTEGER NOT NULL,
    measured_rps REAL,
    forecast_upper REAL,
    needed INTEGER,
    wanted INTEGER,
    emergency INTEGER NOT NULL,
    preempted TEXT NOT NULL,
    reason TEXT NOT NULL,
    applied TEXT NOT NULL,
    held_gpus INTEGER,
    training_gpus INTEGER,
    stopped_gpus INTEGER
);
CREATE INDEX IF NOT EXISTS decisions_at ON decisions (at_s);
-- Preemptions the cluster's queue made (Kueue's count per Workload), as the broker's
-- steps saw the counts rise: one row per rise, so each is counted once.
CREATE TABLE IF NOT EXISTS scheduler_preemptions (
    uid TEXT NOT NULL,
    count INTEGER NOT NULL,
    at_s REAL NOT NULL,
    gpus INTEGER NOT NULL,
    PRIMARY KEY (uid, count)
);
CREATE INDEX IF NOT EXISTS scheduler_preemptions_at ON scheduler_preemptions (at_s);
CREATE TABLE IF NOT EXISTS journal_meta (key TEXT PRIMARY KEY, value REAL NOT NULL);
"""
# Journals written before these were recorded gain the columns (NULL: not recorded).
_UPGRADES = (("held_gpus", "INTEGER"), ("training_gpus", "INTEGER"), ("stopped_gpus", "INTEGER"))


@dataclass(frozen=True)
class PreemptionCount:
    """How often the cluster's queue has preempted one training workload so far (Kueue
    keeps the count in the Workload's status), and what one preemption stops."""

    uid: str
    count: int
    gpus: int  # the GPUs its unfinished pods hold (effective requests): what one stops
    created_s: float


@dataclass(frozen=True)
class DecisionRecord:
    """One row of the broker's decision journal: a decision with its inputs and what was applied."""

    at_s: float
    action: str
    inference_gpus: int
    total_gpus: int
    measured_rps: float | None
    forecast_upper: float | None
    needed: int | None
    wanted: int | None
    emergency: bool
    preempted: tuple[str, ...]
    reason: str
    applied: str
    held_gpus: int | None = None  # inference's GPUs once applied (None: not recorded)
    training_gpus: int | None = None  # GPUs training's gangs hold after the step
    stopped_gpus: int | None = None  # GPUs of the gangs the step stopped (None: not known)

    @property
    def gpus_held(self) -> int:
        """The GPUs inference held after this decision: what the actuator reached (short
        of the decision when it could not take them, unchanged in a dry run); the
        decision's own count in journals from before this was recorded."""
        return self.inference_gpus if self.held_gpus is None else self.held_gpus


class DecisionJournal:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.executescript(_SCHEMA)
            add_missing_columns(db, {"decisions": _UPGRADES})

    def _db(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def record(
        self,
        at_s: float,
        decision: BrokerDecision,
        *,
        total_gpus: int,
        measured_rps: float | None,
        forecast_upper: float | None,
        applied: str = "",
        held_gpus: int | None = None,
        training_gpus: int | None = None,
        stopped_gpus: int | None = None,
    ) -> None:
        with self._db() as db:
            db.execute(
                "INSERT INTO decisions (at_s, action, inference_gpus, total_gpus, "
                "measured_rps, forecast_upper, needed, wanted, emergency, preempted, reason, "
                "applied, held_gpus, training_gpus, stopped_gpus) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    at_s,
                    str(decision.action),
                    decision.inference_gpus,
                    total_gpus,
                    measured_rps,
                    forecast_upper,
                    decision.needed_now,
                    decision.wanted,
                    int(decision.emergency),
                    json.dumps([r.gang_id for r in decision.reclaims if r.evicted]),
                    decision.reason,
                    applied,
                    held_gpus,
                    training_gpus,
                    stopped_gpus,
                ),
            )

    def since(self, at_s: float) -> list[DecisionRecord]:
        if not self.path.exists():
            return []
        with self._db() as db:
            rows = db.execute(
                "SELECT at_s, action, inference_gpus, total_gpus, measured_rps, "
                "forecast_upper, needed, wanted, emergency, preempted, reason, applied, "
                "held_gpus, training_gpus, stopped_gpus FROM decisions WHERE at_s >= ? "
                "ORDER BY at_s",
                (at_s,),
            ).fetchall()
        return [
            DecisionRecord(
                float(r[0]),
                str(r[1]),
                int(r[2]),
                int(r[3]),
                r[4],
                r[5],
                r[6],
                r[7],
                bool(r[8]),
                tuple(json.loads(r[9])),
                str(r[10]),
                str(r[11]),
                None if r[12] is None else int(r[12]),
                None if r[13] is None else int(r[13]),
                None if r[14] is None else int(r[14]),
            )
            for r in rows
        ]

    def training_work(self, since_s: float, until_s: float) -> TrainingWork | None:
        """Training's GPU-time and stops over [since, until), as the broker saw them at
        its steps: each step's training GPUs held until the next recorded step (steps
        are recorded only when they act where the broker runs as the Airflow DAG, and
        training goes on while the broker is down), and the GPUs of the gangs it
        stopped. None where no step recorded them (a journal from before they were).
        Counted from the first such step: the span before it is not known."""
        entries = [
            e for e in self.since(since_s) if e.at_s < until_s and e.training_gpus is not None
        ]
        if not entries:
            return None
        trained = 0.0
        for entry, after in zip(entries, [*(e.at_s for e in entries[1:]), until_s], strict=True):
            trained += (entry.training_gpus or 0) * (after - entry.at_s)
        stopped = sum(e.stopped_gpus or 0 for e in entries)
        with self._db() as db:
            (by_queue,) = db.execute(
                "SELECT COALESCE(SUM(gpus), 0) FROM scheduler_preemptions "
                "WHERE at_s >= ? AND at_s < ?",
                (since_s, until_s),
            ).fetchone()
        return TrainingWork(trained, 0.0, stopped + int(by_queue))

    def record_preemptions(
        self,
        at_s: float,
        counts: Iterable[PreemptionCount],
        keep_s: float = PREEMPTIONS_KEPT_S,
    ) -> None:
        """Journal the preemptions the queue made since the last step: each workload's
        count over the highest count journaled for it, at ``at_s``. A workload seen for
        the first time counts from zero when it was created after the journal began
        watching, else from its count now (what came before is not known to be recent):
        a row of no GPUs then marks where it starts. ``counts`` lists every training
        workload the queue holds: one it no longer lists, with no row for ``keep_s``, is
        forgotten (its uid is never reused, and the budget never weighs rows that old)."""
        counts = list(counts)
        with self._db() as db:
            # Read and write under one write lock: two steps at once (the DAG's and a
            # service's) must not both count the rise from the same journaled count.
            # (The first INSERT below would take it too; this does not depend on order.)
            db.execute("BEGIN IMMEDIATE")
            db.execute(
                "INSERT OR IGNORE INTO journal_meta VALUES ('preemptions_watched_since', ?)",
                (at_s,),
            )
            (since,) = db.execute(
                "SELECT value FROM journal_meta WHERE key = 'preemptions_watched_since'"
            ).fetchone()
            for seen_now in counts:
                (before,) = db.execute(
                    "SELECT MAX(count) FROM scheduler_preemptions WHERE uid = ?", (seen_now.uid,)
                ).fetchone()
                first = before is None
                if first:
                    before = 0 if seen_now.created_s >= since else seen_now.count
                elif seen_now.count <= before:
                    continue
                db.execute(
                    "INSERT OR IGNORE INTO scheduler_preemptions VALUES (?, ?, ?, ?)",
                    (seen_now.uid, seen_now.count, at_s, seen_now.gpus * (seen_now.count - before)),
                )
            listed = {seen_now.uid for seen_now in counts}
            gone = [
                (uid,)
                for (uid,) in db.execute(
                    "SELECT uid FROM scheduler_preemptions GROUP BY uid HAVING MAX(at_s) < ?",
                    (at_s - keep_s,),
                )
                if uid not in listed
            ]
            db.executemany("DELETE FROM scheduler_preemptions WHERE uid = ?", gone)

    def last(self) -> DecisionRecord | None:
        with self._db() as db:
            row = db.execute("SELECT MAX(at_s) FROM decisions").fetchone()
        return self.since(float(row[0]))[-1] if row and row[0] is not None else None

    def last_lend_s(self) -> float | None:
        with self._db() as db:
            row = db.execute("SELECT MAX(at_s) FROM decisions WHERE action = 'lend'").fetchone()
        return float(row[0]) if row and row[0] is not None else None
