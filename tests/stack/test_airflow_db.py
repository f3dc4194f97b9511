"""The local stack's Airflow components share one SQLite file: a writer waits its turn.

The API server (for the tasks too, through its execution API), the scheduler,
the DAG processor and the triggerer write to ``$AIRFLOW_HOME/airflow.db``.
SQLite lets one writer in at a time and, by default, a connection gives up after
5 s with "database is locked"; on a busy two-core machine the scheduler can hold
the lock that long, and a trigger from the UI then answered HTTP 500. Runs
Airflow's own engine set-up in a subprocess with the stack's environment.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tideflow.stack.processes import free_port
from tideflow.stack.services import StackState, airflow_env

pytestmark = pytest.mark.processes

HOLD_S = 7  # longer than SQLite's default busy timeout (5 s)

WRITE_WHILE_LOCKED = f"""
import sqlite3, threading, time
from airflow import settings

settings.configure_orm()
path = settings.engine.url.database
holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
holder.execute("PRAGMA journal_mode=WAL")  # as `airflow db migrate` leaves the file
holder.execute("CREATE TABLE queue (n INTEGER)")
holder.execute("BEGIN IMMEDIATE")  # take the write lock, as a long scheduler transaction does
holder.execute("INSERT INTO queue VALUES (1)")
threading.Timer({HOLD_S}, holder.commit).start()
started = time.monotonic()
with settings.engine.begin() as connection:
    connection.exec_driver_sql("INSERT INTO queue VALUES (2)")
print(path, round(time.monotonic() - started, 1))
"""


def test_an_airflow_write_waits_for_a_lock_held_longer_than_sqlites_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """... in the stack's own database, whatever metadata database the user's
    environment names (the stack must never write to a production one)."""
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "postgresql://prod.example/airflow")
    env = airflow_env(
        StackState(home=str(tmp_path)), free_port(), tmp_path / "dags", tmp_path / "pipelines"
    )
    (tmp_path / "airflow").mkdir()
    done = subprocess.run(
        [sys.executable, "-c", WRITE_WHILE_LOCKED],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    path, waited = done.stdout.strip().splitlines()[-1].split()
    assert path == str(tmp_path / "airflow" / "airflow.db")
    assert float(waited) >= HOLD_S - 1  # it waited for the holder rather than writing past it
