"""The teams' scheduling decisions, as the ledger journals them (``LeaseLedger.journal``).

One row per decision: a gang admitted, waiting (when its reason changes), refused
for good, asked to stop, and how it stopped. The page and ``tideflow`` reports
read it; the replay compares it between runs.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Collection
from dataclasses import dataclass


@dataclass(frozen=True)
class LedgerEvent:
    """One scheduling event the lease ledger journals for a gang (admit, wait, evict, ...)."""

    at: float
    gang_id: str
    team: str
    action: str  # admit, wait, refuse, evict, preempted, forced
    reason: str


def write(  # noqa: PLR0917 (one journal row's fields)
    db: sqlite3.Connection, now: float, gang_id: str, team: str, action: str, reason: str
) -> None:
    db.execute(
        "INSERT INTO journal (at, gang_id, team, action, reason) VALUES (?, ?, ?, ?, ?)",
        (now, gang_id, team, action, reason),
    )


def new_reason(before: str | None, reason: str) -> bool:
    """Whether a waiting gang's ``reason`` is news: the journal records why a gang
    waits when the reason changes, not every poll (numbers such as "waited 1830s"
    change every poll: they do not make a new reason)."""
    return before is None or _shape(before) != _shape(reason)


def _shape(reason: str) -> str:
    return re.sub(r"\d+", "#", reason)


def read(
    db: sqlite3.Connection, since: float, limit: int, actions: Collection[str] | None
) -> list[LedgerEvent]:
    """The last ``limit`` entries since ``since`` of the ``actions`` named (all when
    None), oldest first."""
    where = "at >= ?"
    params: list[object] = [since]
    if actions is not None:
        chosen = sorted(set(actions))
        if not chosen:
            return []
        where += f" AND action IN ({', '.join('?' * len(chosen))})"
        params += chosen
    rows = db.execute(
        "SELECT at, gang_id, team, action, reason FROM journal "
        f"WHERE {where} ORDER BY seq DESC LIMIT ?",
        (*params, limit),
    ).fetchall()
    return [
        LedgerEvent(float(a), str(g), str(t), str(x), str(r)) for a, g, t, x, r in reversed(rows)
    ]
