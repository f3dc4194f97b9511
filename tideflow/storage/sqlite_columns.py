"""Upgrading a SQLite file written by an older tideflow: the columns it lacks."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence


def add_missing_columns(
    db: sqlite3.Connection, columns: Mapping[str, Sequence[tuple[str, str]]]
) -> None:
    """Add each ``(name, type)`` of ``columns[table]`` that the table lacks.

    Processes that open one file together after an upgrade (Airflow's scheduler,
    workers and triggerer; the broker's sensor and its page) may all find a column
    missing: the first adds it and the others find it added.
    """
    for table, wanted in columns.items():
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        for name, kind in wanted:
            if name in have:
                continue
            try:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")
            except sqlite3.OperationalError as exc:
                if "duplicate column name" not in str(exc):
                    raise
