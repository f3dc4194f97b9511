"""The journal records the GPUs inference held after each step, not only those decided,
and the SLO calibration and the throughput learner judge windows by them.

A real ledger and decision journal; no gangs (the actuator has no backend).
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from tests.at_once import open_at_once
from tests.fakes import WindowedLoad
from tideflow.broker import Action, PolicyConfig
from tideflow.broker.journal import DecisionJournal
from tideflow.broker.local import LocalActuator
from tideflow.broker.service import coverage, rebalance_once, served_windows
from tideflow.inventory import Inventory, Node, load_cluster
from tideflow.scheduling import LeaseLedger

CONFIG = PolicyConfig(
    total_gpus=2, per_gpu_rps=10.0, node_gpus=1, headroom=0.0, min_inference_gpus=0, cooldown_s=0
)

# The decisions table as journals were written before the GPUs held were recorded.
OLD_DECISIONS_TABLE = """
CREATE TABLE decisions (
    at_s REAL NOT NULL, action TEXT NOT NULL, inference_gpus INTEGER NOT NULL,
    total_gpus INTEGER NOT NULL, measured_rps REAL, forecast_upper REAL, needed INTEGER,
    wanted INTEGER, emergency INTEGER NOT NULL, preempted TEXT NOT NULL,
    reason TEXT NOT NULL, applied TEXT NOT NULL
);
INSERT INTO decisions VALUES (600, 'grow', 2, 2, 12.0, 12.0, 2, 2, 0, '[]', 'old', 'grew 2');
"""


# The same load in every 10-minute window (12 rps: 2 GPUs at 10 rps each).
STEADY = WindowedLoad(12.0, ended_only=True)


def lab(tmp_path: Path) -> tuple[LeaseLedger, LocalActuator]:
    nodes = (Node("n0", 8, "gpu", "T4", 1), Node("n1", 8, "gpu", "T4", 1))
    ledger = LeaseLedger(tmp_path / "leases.db", Inventory("lab", nodes, declared=True))
    return ledger, LocalActuator(ledger, None, node_gpus=1)


def test_a_dry_run_is_judged_by_the_gpus_held_not_those_decided(tmp_path: Path) -> None:
    _, actuator = lab(tmp_path)
    journal = DecisionJournal(tmp_path / "broker.db")
    first, _ = rebalance_once(STEADY, actuator, CONFIG, journal, now_s=7200.0, act=False)
    assert first.action is Action.GROW and first.inference_gpus == 2
    rebalance_once(STEADY, actuator, CONFIG, journal, now_s=7800.0, act=False)
    entries = journal.since(0)
    assert [(e.inference_gpus, e.gpus_held) for e in entries] == [(2, 0), (2, 0)]
    # The window after the first step needed 2 GPUs; inference held none of them.
    assert coverage(entries, 600.0) == [False]
    assert [w.gpus for w in served_windows(STEADY, entries, 7200.0, 7800.0)] == [0]


def test_a_growth_the_actuator_could_not_complete_counts_what_it_reached(
    tmp_path: Path,
) -> None:
    """Inference is a team with a quota of 2 of the lab's 3 GPUs; the policy, not told
    the quota, decides 3 for a load that needs them, and the actuator stops at 2."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "apiVersion: tideflow/v1\nkind: Cluster\nmetadata: {name: lab}\nnodes:\n"
        "  - {name: n, count: 3, cpu: 8, accelerators: {class: gpu, model: T4, count: 1}}\n"
        "teams:\n  - {name: inference, quota: [{device: gpu, nominal: 2}]}\n"
    )
    ledger = LeaseLedger(tmp_path / "leases.db", load_cluster(cluster))
    actuator = LocalActuator(ledger, None, node_gpus=1, poll_s=0.01)
    config = replace(CONFIG, total_gpus=3)
    journal = DecisionJournal(tmp_path / "broker.db")
    load = WindowedLoad(30.0, ended_only=True)
    decision, applied = rebalance_once(load, actuator, config, journal, now_s=7200.0)
    assert decision.inference_gpus == 3 and applied is not None
    assert applied.inference_gpus == 2 and "capped at inference's quota of 2" in applied.note
    rebalance_once(load, actuator, config, journal, now_s=7800.0)
    entries = journal.since(0)
    assert entries[0].gpus_held == 2 == applied.inference_gpus
    assert coverage(entries, 600.0) == [False]


def test_an_old_journal_reads_its_decisions_as_held(tmp_path: Path) -> None:
    path = tmp_path / "broker.db"
    with sqlite3.connect(path) as db:
        db.executescript(OLD_DECISIONS_TABLE)
    (entry,) = DecisionJournal(path).since(0)
    assert (entry.held_gpus, entry.gpus_held, entry.reason) == (None, 2, "old")


@pytest.mark.processes
def test_processes_opening_an_old_journal_at_once_all_upgrade_it(tmp_path: Path) -> None:
    """The broker DAG's sensor, its rebalance task and the page open the journal together
    after an upgrade; each adds the missing column. Four processes released together by
    a barrier, over 10 old journals."""
    for round_ in range(10):
        path = tmp_path / f"broker-{round_}.db"
        with sqlite3.connect(path) as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(OLD_DECISIONS_TABLE)
        assert open_at_once(DecisionJournal, (path,), 4) == []
        with sqlite3.connect(path) as db:
            columns = [row[1] for row in db.execute("PRAGMA table_info(decisions)")]
        assert columns.count("held_gpus") == 1


# 10 rps (one GPU at 10 rps each) until window 200, then 30 rps (three GPUs).
JUMP = WindowedLoad(lambda start: 10.0 if start < 200 * 600.0 else 30.0, ended_only=True)


def test_a_second_step_in_the_window_does_not_erase_the_miss_the_first_grew_for(
    tmp_path: Path,
) -> None:
    """The broker steps more often than the load's windows (``--interval 60``). The
    first step after the jump measures a window inference did not cover and grows; the
    next step in the same window measures that window again. It was covered by what
    was held during it, not by what the first step grew to since."""
    nodes = tuple(Node(f"n{i}", 8, "gpu", "T4", 1) for i in range(4))
    ledger = LeaseLedger(tmp_path / "leases.db", Inventory("lab", nodes, declared=True))
    actuator = LocalActuator(ledger, None, node_gpus=1)
    config = replace(CONFIG, total_gpus=4, lost_work_budget=None)
    journal = DecisionJournal(tmp_path / "broker.db")
    for at_s in (200 * 600 + 10, 201 * 600 + 10, 201 * 600 + 70):
        rebalance_once(JUMP, actuator, config, journal, now_s=at_s)
    entries = journal.since(0)
    assert [e.gpus_held for e in entries][:2] == [1, 3]  # the first step grew
    assert entries[1].emergency and entries[2].needed == 3
    assert coverage(entries, 600.0) == [False]
