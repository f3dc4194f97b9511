"""Accounting: device-hours per team, pipeline and DAG run, split into own quota,
borrowed and lost; budgets; the teams' quota view; ``tideflow usage``.

The ledger is real (SQLite, ``try_acquire``/``release``) and driven with a fake
clock through one day of a small bank: risk borrows 2 of marketing's GPUs,
marketing reclaims them and risk's gang is stopped 20 minutes after its last
checkpoint; a second run of risk's pipeline evaluates; the broker reserves 2 GPUs
for an hour; marketing starts a second run that is still running at the end.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.at_once import open_at_once
from tideflow.inventory import load_cluster
from tideflow.scheduling import GangRequest, Lease, LeaseLedger
from tideflow.scheduling.accounting import (
    BROKER_PREFIX,
    Split,
    TeamQuotaRow,
    UsageTotal,
    budgets,
    gang_usage,
    group_key,
    month_window,
    parse_when,
    report_columns,
    team_view,
    usage_totals,
)

CLUSTER = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: bank}
nodes:
  - {name: box, count: 1, cpu: 32, accelerators: {class: gpu, model: H100, count: 8}}
priority_classes:
  - {name: urgent, value: 1000, preempts: true}
  - {name: normal, value: 100}
teams:
  - name: risk
    quota: [{device: gpu, nominal: 4, borrowing_limit: 4, budget_device_hours: 10}]
    default_priority_class: normal
  - name: marketing
    quota: [{device: gpu, nominal: 4, budget_device_hours: 100}]
    default_priority_class: normal
borrowing:
  - {lender: marketing, borrower: risk, grace: 10m}
"""
T0 = dt.datetime(2026, 11, 2, tzinfo=dt.UTC).timestamp()  # a Monday, 00:00 UTC
HOUR = 3600.0
TTL = 86400.0
CHECKPOINT_AGE_S = 1200.0  # risk's gang last checkpointed 20 minutes before its stop


class Day:
    """The ledger, its clock, and the leases of the story so far."""

    def __init__(self, tmp_path: Path) -> None:
        self.cluster = tmp_path / "bank.yaml"
        self.cluster.write_text(CLUSTER)
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.now = T0
        self.ledger = LeaseLedger(
            self.home / "leases.db", load_cluster(self.cluster), clock=lambda: self.now
        )
        self.leases: dict[str, Lease] = {}

    def at(self, hours: float) -> None:
        self.now = T0 + hours * HOUR

    def take(self, gang_id: str, team: str, devices: int, *, per: int = 1) -> Lease | str:
        if team == "inference":
            request = GangRequest(gang_id, team, "gpu", None, 1, per, 1_000_000, False)
        else:
            request = GangRequest(
                gang_id, team, "gpu", None, devices, per, 100, priority_class="normal"
            )
        got = self.ledger.try_acquire(request, "test", TTL)
        if isinstance(got, Lease):
            self.leases[gang_id] = got
            return got
        return got.reason

    def give_back(self, gang_id: str, lost_s: float = 0.0) -> None:
        self.ledger.release(self.leases.pop(gang_id).lease_id, lost_s=lost_s)


def play(day: Day, until_hours: float = 7.0, views: Callable[[Day], None] | None = None) -> None:
    day.at(0)
    assert isinstance(day.take("fraud/run1/train", "risk", 6), Lease)  # 4 own + 2 borrowed
    if views is not None:
        views(day)
    day.at(1.5)
    waits = day.take("ads/run1/train", "marketing", 4)
    assert isinstance(waits, str) and "reclaimed by its lender marketing" in waits
    day.give_back("fraud/run1/train", lost_s=CHECKPOINT_AGE_S)  # stopped: ends "forced"
    assert isinstance(day.take("ads/run1/train", "marketing", 4), Lease)
    day.at(2)
    assert isinstance(day.take("fraud/run2/evaluate", "risk", 1), Lease)
    day.at(3.5)
    day.give_back("ads/run1/train")
    day.at(4)
    day.give_back("fraud/run2/evaluate")
    day.at(5)
    assert isinstance(day.take(f"{BROKER_PREFIX}0", "inference", 1, per=2), Lease)
    assert isinstance(day.take("ads/run2/train", "marketing", 2), Lease)  # runs on
    day.at(6)
    day.give_back(f"{BROKER_PREFIX}0")
    day.at(until_hours)


def numbers(rows: list[UsageTotal]) -> dict[str, tuple[float, float, float, float, int, int]]:
    """Each group's (device, own, borrowed, lost) hours, preempted leases and gangs."""
    return {
        r.key: (
            round(r.device_hours, 6),
            round(r.own_hours, 6),
            round(r.borrowed_hours, 6),
            round(r.lost_hours, 6),
            r.preempted,
            r.gangs,
        )
        for r in rows
    }


def test_device_hours_per_team_pipeline_and_run_split_into_own_borrowed_and_lost(
    tmp_path: Path,
) -> None:
    day = Day(tmp_path)
    play(day)
    end = T0 + 7 * HOUR
    spans = day.ledger.usage_spans(T0, end)
    assert {s.gang_id: s.ended_by for s in spans}["ads/run2/train"] == "held"
    # fraud/run1: 6 GPUs for 1.5 h, 2 of them borrowed; 20 min of work lost on each of 6
    assert numbers(usage_totals(spans, "team", until=end)) == {
        "inference": (2.0, 2.0, 0.0, 0.0, 0, 1),  # outside quotas: all its own
        "marketing": (12.0, 12.0, 0.0, 0.0, 0, 2),  # 4 x 2 h + 2 x 2 h (still held)
        "risk": (11.0, 8.0, 3.0, 2.0, 1, 2),  # 6 x 1.5 h + 1 x 2 h
    }
    assert numbers(usage_totals(spans, "pipeline", until=end)) == {
        "ads": (12.0, 12.0, 0.0, 0.0, 0, 2),
        "broker/inference": (2.0, 2.0, 0.0, 0.0, 0, 1),
        "fraud": (11.0, 8.0, 3.0, 2.0, 1, 2),
    }
    assert numbers(usage_totals(spans, "run", until=end)) == {
        "ads/run1": (8.0, 8.0, 0.0, 0.0, 0, 1),
        "ads/run2": (4.0, 4.0, 0.0, 0.0, 0, 1),
        "broker/inference": (2.0, 2.0, 0.0, 0.0, 0, 1),
        "fraud/run1": (9.0, 6.0, 3.0, 2.0, 1, 1),
        "fraud/run2": (2.0, 2.0, 0.0, 0.0, 0, 1),
    }
    # the split one gang's MLflow run is tagged with
    assert gang_usage(spans, "fraud/run1/train") == Split(6.0, 3.0, 2.0)
    assert gang_usage(spans, "fraud/run1/train").device_hours == 9.0
    assert gang_usage(spans, "no/such/gang") == Split()


def test_a_window_counts_only_its_part_and_a_stop_only_where_it_happened(tmp_path: Path) -> None:
    day = Day(tmp_path)
    play(day, until_hours=6.0)
    # 1 h .. 6 h: the last half hour of fraud/run1 (and its stop), the held run up to 6 h
    end = T0 + 6 * HOUR
    spans = day.ledger.usage_spans(T0 + HOUR, end)
    assert numbers(usage_totals(spans, "team", until=end)) == {
        "inference": (2.0, 2.0, 0.0, 0.0, 0, 1),
        "marketing": (10.0, 10.0, 0.0, 0.0, 0, 2),
        "risk": (5.0, 4.0, 1.0, 2.0, 1, 2),
    }
    # 0 .. 1 h: fraud/run1 was still running at the window's end: no stop, nothing lost
    first = day.ledger.usage_spans(T0, T0 + HOUR)
    assert numbers(usage_totals(first, "run", until=T0 + HOUR)) == {
        "fraud/run1": (6.0, 4.0, 2.0, 0.0, 0, 1),
    }


def test_budgets_of_the_calendar_month(tmp_path: Path) -> None:
    day = Day(tmp_path)
    play(day)
    start, end = month_window(T0 + 7 * HOUR)
    assert start == dt.datetime(2026, 11, 1, tzinfo=dt.UTC).timestamp()
    assert end == dt.datetime(2026, 12, 1, tzinfo=dt.UTC).timestamp()
    december = dt.datetime(2026, 12, 31, 23, 59, tzinfo=dt.UTC).timestamp()
    assert month_window(december)[1] == dt.datetime(2027, 1, 1, tzinfo=dt.UTC).timestamp()
    used = budgets(day.ledger.inventory.teams, day.ledger.usage_spans(start, T0 + 7 * HOUR))
    assert [(b.team, b.device_class, b.budget_hours, b.used_hours, b.share) for b in used] == [
        ("marketing", "gpu", 100.0, 12.0, 0.12),
        ("risk", "gpu", 10.0, 11.0, 1.1),  # over budget: shown, not enforced
    ]
    assert budgets(None, []) == []


def test_team_view_shows_quota_in_use_borrowed_and_lent_now(tmp_path: Path) -> None:
    seen: list[list[TeamQuotaRow]] = []

    def look(day: Day) -> None:
        assert day.ledger.teams is not None
        seen.append(team_view(day.ledger.teams, day.ledger.leases()))

    day = Day(tmp_path)
    play(day, views=look)
    assert seen[0] == [
        TeamQuotaRow("marketing", "gpu", None, nominal=4, in_use=0, borrowed=0, lent=2),
        TeamQuotaRow("risk", "gpu", None, nominal=4, in_use=6, borrowed=2, lent=0),
    ]
    assert day.ledger.teams is not None
    at_end = team_view(day.ledger.teams, day.ledger.leases())  # the broker's team: no row
    assert [(r.team, r.in_use, r.borrowed, r.lent) for r in at_end] == [
        ("marketing", 2, 0, 0),
        ("risk", 0, 0, 0),
    ]
    assert at_end[0].label == "gpu"


def test_group_keys_of_gangs_reservations_and_other_leases() -> None:
    from tideflow.broker.local import INFERENCE_PREFIX

    assert BROKER_PREFIX == INFERENCE_PREFIX  # copied: scheduling may not import the broker
    run = "manual__2026-11-02T05:38:10+00:00"
    assert group_key(f"digits/{run}/train", "pipeline", "vision") == "digits"
    assert group_key(f"digits/{run}/train", "run", "vision") == f"digits/{run}"
    assert group_key(f"digits/{run}/train", "team", "vision") == "vision"
    assert group_key("broker/inference/3", "run", "inference") == "broker/inference"
    for loose in ("hand-made-gang", "digits/train", "digits//train"):
        assert group_key(loose, "pipeline", "vision") == loose
    with pytest.raises(ValueError, match="unknown grouping 'dag'"):
        usage_totals([], "dag")  # type: ignore[arg-type]


def test_when_parses_dates_and_durations_and_says_what_it_accepts() -> None:
    now = T0 + 7 * HOUR
    assert parse_when("7d", now) == now - 7 * 86400
    assert parse_when("24h", now) == now - 86400
    assert parse_when("1d12h", now) == now - 36 * HOUR
    assert parse_when("2w", now) == now - 14 * 86400
    assert parse_when("2026-11-02", now) == T0  # UTC
    assert parse_when("2026-11-02T08:00+02:00", now) == T0 + 6 * HOUR
    for bad in ("yesterday", "7", "", "7x", "2026-13-01"):
        with pytest.raises(ValueError, match=r"^--until ") as raised:
            parse_when(bad, now, "--until")
        assert "ISO date" in str(raised.value) and "7d" in str(raised.value)


# -- tideflow usage ----------------------------------------------------------------------


def usage(day: Day, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "TIDEFLOW_HOME": str(day.home),
        "TIDEFLOW_CLUSTER_FILE": str(day.cluster),
    }
    return subprocess.run(
        [sys.executable, "-m", "tideflow.cli", "usage", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


WINDOW = ("--since", "2026-11-02", "--until", "2026-11-02T07:00")


@pytest.mark.processes
def test_usage_csv_by_team_has_the_split_and_the_months_budget(tmp_path: Path) -> None:
    day = Day(tmp_path)
    play(day)
    done = usage(day, *WINDOW, "--format", "csv")
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert tuple(rows[0]) == report_columns("team")
    assert rows == [
        {
            "team": "inference",
            "device_class": "gpu",
            "device_hours": "2.0000",
            "own_hours": "2.0000",
            "borrowed_hours": "0.0000",
            "lost_hours": "0.0000",
            "preempted": "0",
            "gangs": "1",
            "budget_device_hours": "",
            "month_device_hours": "",
            "budget_used": "",
            "model": "H100",
        },
        {
            "team": "marketing",
            "device_class": "gpu",
            "device_hours": "12.0000",
            "own_hours": "12.0000",
            "borrowed_hours": "0.0000",
            "lost_hours": "0.0000",
            "preempted": "0",
            "gangs": "2",
            "budget_device_hours": "100.0000",
            "month_device_hours": "12.0000",
            "budget_used": "0.1200",
            "model": "H100",
        },
        {
            "team": "risk",
            "device_class": "gpu",
            "device_hours": "11.0000",
            "own_hours": "8.0000",
            "borrowed_hours": "3.0000",
            "lost_hours": "2.0000",
            "preempted": "1",
            "gangs": "2",
            "budget_device_hours": "10.0000",
            "month_device_hours": "11.0000",
            "budget_used": "1.1000",
            "model": "H100",
        },
    ]
    # the budget is the month's whatever the window: from 6 h on, risk used 0 in it
    late = usage(
        day, "--since", "2026-11-02T06:00", "--until", "2026-11-02T07:00", "--format", "csv"
    )
    by_team = {r["team"]: r for r in csv.DictReader(io.StringIO(late.stdout))}
    assert (by_team["risk"]["device_hours"], by_team["risk"]["budget_used"]) == ("0.0000", "1.1000")


@pytest.mark.processes
def test_usage_csv_by_run_and_json_by_pipeline(tmp_path: Path) -> None:
    day = Day(tmp_path)
    play(day)
    done = usage(day, *WINDOW, "--by", "run", "--format", "csv")
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert [
        (r["run"], r["team"], float(r["own_hours"]), float(r["borrowed_hours"]), r["preempted"])
        for r in rows
    ] == [
        ("ads/run1", "marketing", 8.0, 0.0, "0"),
        ("ads/run2", "marketing", 4.0, 0.0, "0"),
        ("broker/inference", "inference", 2.0, 0.0, "0"),
        ("fraud/run1", "risk", 6.0, 3.0, "1"),
        ("fraud/run2", "risk", 2.0, 0.0, "0"),
    ]
    assert "budget_used" not in rows[0]
    done = usage(day, *WINDOW, "--by", "pipeline", "--format", "json")
    assert done.returncode == 0, done.stderr
    fraud = next(r for r in json.loads(done.stdout) if r["pipeline"] == "fraud")
    assert fraud["lost_hours"] == 2.0 and fraud["device_hours"] == 11.0
    table = usage(day, *WINDOW)
    assert table.returncode == 0, table.stderr
    assert "110%" in table.stdout and "BORROWED-H" in table.stdout


@pytest.mark.processes
@pytest.mark.parametrize(
    ("args", "names"),
    [
        (("--since", "yesterday"), "--since 'yesterday' is neither a date nor a duration"),
        (("--until", "7"), "--until '7' is neither a date nor a duration"),
        (("--since", "2026-11-03", "--until", "2026-11-02"), "--since (2026-11-03 00:00:00) must"),
    ],
)
def test_usage_refuses_a_window_it_cannot_read(
    tmp_path: Path, args: tuple[str, ...], names: str
) -> None:
    done = usage(Day(tmp_path), *args)
    assert done.returncode == 2 and not done.stdout
    assert done.stderr.startswith("tideflow usage: " + names), done.stderr
    assert "Traceback" not in done.stderr
    if "neither" in names:
        assert "ISO date or date-time" in done.stderr and "24h, 7d" in done.stderr


@pytest.mark.processes
def test_usage_without_a_ledger_prints_the_header_only(tmp_path: Path) -> None:
    day = Day(tmp_path)
    (day.home / "leases.db").unlink()
    done = usage(day, "--format", "csv")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ",".join(report_columns("team"))
    assert "no lease ledger" in done.stderr
    assert not (day.home / "leases.db").exists()  # reading makes no ledger


# -- device models -----------------------------------------------------------------------
TWO_MODELS = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: mixed}
nodes:
  - {name: h100, count: 1, cpu: 32, accelerators: {class: gpu, model: H100, count: 8}}
  - {name: a100, count: 1, cpu: 32, accelerators: {class: gpu, model: A100, count: 8}}
teams:
  - name: vision
    quota:
      - {device: gpu, model: H100, nominal: 4, budget_device_hours: 10}
      - {device: gpu, nominal: 4, budget_device_hours: 100}
"""


def two_models(tmp_path: Path) -> Day:
    """Vision's gangs on both models of a real ledger: 4 H100 for 2 h (one gang), 2 A100
    for 1 h (another), 1 H100 for 1 h (a third, whose pipeline asked for no model)."""
    day = Day(tmp_path)
    day.cluster.write_text(TWO_MODELS)
    day.ledger = LeaseLedger(
        day.home / "leases.db", load_cluster(day.cluster), clock=lambda: day.now
    )
    day.at(0)
    for gang_id, model, devices in (
        ("seg/run1/train", "H100", 4),
        ("seg/run1/tune", "A100", 2),
    ):
        request = GangRequest(gang_id, "vision", "gpu", model, devices, 1, 100)
        got = day.ledger.try_acquire(request, "test", TTL)
        assert isinstance(got, Lease) and got.model == model, got
        day.leases[gang_id] = got
    day.at(1)
    day.give_back("seg/run1/tune")
    loose = day.ledger.try_acquire(
        GangRequest("det/run1/train", "vision", "gpu", None, 1, 1, 100), "test", TTL
    )
    assert isinstance(loose, Lease)
    day.leases["det/run1/train"] = loose
    day.at(2)
    day.give_back("seg/run1/train")
    day.give_back("det/run1/train")
    day.at(3)
    return day


@pytest.mark.processes
def test_usage_rows_name_the_device_model_and_a_models_budget_counts_only_its_hours(
    tmp_path: Path,
) -> None:
    """Each lease's span carries the model it was granted on; rows are per model, the
    model column last (the columns before it as they were); the H100 budget counts
    H100 hours only, the class-wide budget the rest of the class."""
    day = two_models(tmp_path)
    spans = day.ledger.usage_spans(T0, T0 + 3 * HOUR)
    models = {s.gang_id: s.model for s in spans}
    det = models.pop("det/run1/train")  # granted on whichever model was free: recorded
    assert models == {"seg/run1/train": "H100", "seg/run1/tune": "A100"}
    assert det in ("H100", "A100")
    h100 = 8.0 + (1.0 if det == "H100" else 0.0)
    a100 = 2.0 + (1.0 if det == "A100" else 0.0)
    window = ("--since", "2026-11-02", "--until", "2026-11-02T03:00", "--format", "csv")
    done = usage(day, *window)
    assert done.returncode == 0, done.stderr
    header = done.stdout.splitlines()[0].split(",")
    assert header == [*report_columns("team")] and header[-1] == "model"
    assert header[:-1] == [
        "team",
        "device_class",
        "device_hours",
        "own_hours",
        "borrowed_hours",
        "lost_hours",
        "preempted",
        "gangs",
        "budget_device_hours",
        "month_device_hours",
        "budget_used",
    ]
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert [
        (
            r["team"],
            r["model"],
            float(r["device_hours"]),
            r["budget_device_hours"],
            float(r["month_device_hours"]),
        )
        for r in rows
    ] == [
        ("vision", "A100", a100, "100.0000", a100),  # the class-wide budget: not H100's hours
        ("vision", "H100", h100, "10.0000", h100),  # the H100 budget: H100 hours only
    ]
    by_run = usage(day, *window, "--by", "run")
    assert by_run.returncode == 0, by_run.stderr
    runs = list(csv.DictReader(io.StringIO(by_run.stdout)))
    assert tuple(runs[0]) == report_columns("run") and report_columns("run")[-1] == "model"
    seg = {r["model"]: float(r["device_hours"]) for r in runs if r["run"] == "seg/run1"}
    assert seg == {"H100": 8.0, "A100": 2.0}
    assert {(t.key, t.model) for t in usage_totals(spans, "pipeline")} == {
        ("det", det),
        ("seg", "A100"),
        ("seg", "H100"),
    }


# The usage table as ledgers wrote it before spans recorded the device model.
OLD_USAGE_TABLE = """\
CREATE TABLE usage (
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
"""


@pytest.mark.processes
def test_a_ledger_written_before_models_keeps_its_rows_their_model_unknown(
    tmp_path: Path,
) -> None:
    """An existing ledger database gains the model column when the new code opens it;
    its rows stay, with the model unknown (empty in the report), and new leases record
    theirs beside them."""
    import sqlite3

    day = Day(tmp_path)
    (day.home / "leases.db").unlink()
    with sqlite3.connect(day.home / "leases.db") as db:
        db.executescript(OLD_USAGE_TABLE)
        db.execute(
            "INSERT INTO usage VALUES ('l-old', 'fraud/run0/train', 'risk', 'gpu', 2, ?, ?, "
            "'released', 0, 0)",
            (T0, T0 + HOUR),
        )
    ledger = LeaseLedger(day.home / "leases.db", load_cluster(day.cluster), clock=lambda: day.now)
    day.ledger = ledger
    day.at(1)
    assert isinstance(day.take("fraud/run1/train", "risk", 1), Lease)
    day.at(2)
    day.give_back("fraud/run1/train")
    spans = {s.gang_id: s for s in ledger.usage_spans(T0, T0 + 2 * HOUR)}
    assert (spans["fraud/run0/train"].model, spans["fraud/run0/train"].device_hours) == (None, 2.0)
    assert spans["fraud/run1/train"].model == "H100"
    done = usage(day, "--since", "2026-11-02", "--until", "2026-11-02T02:00", "--format", "csv")
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    risk = [(r["model"], float(r["device_hours"])) for r in rows if r["team"] == "risk"]
    assert risk == [("", 2.0), ("H100", 1.0)]


def _open_ledger(path: Path, cluster: Path) -> None:
    LeaseLedger(path, load_cluster(cluster))


@pytest.mark.processes
def test_processes_opening_an_old_ledger_at_once_all_upgrade_it(tmp_path: Path) -> None:
    """The scheduler, workers and triggerer open the ledger together after an upgrade:
    each reads the usage table's columns and adds the missing one, so without one
    transaction around both, all but one fail ('duplicate column name'). Six processes,
    released together by a barrier, over 15 fresh old ledgers."""
    import sqlite3

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "apiVersion: tideflow/v1\nkind: Cluster\nmetadata: {name: lab}\nnodes:\n"
        "  - {name: h100, count: 1, cpu: 8, accelerators: {class: gpu, model: H100, count: 2}}\n"
    )
    for round_ in range(15):
        path = tmp_path / f"leases-{round_}.db"
        with sqlite3.connect(path) as db:
            db.execute("PRAGMA journal_mode=WAL")  # as every tideflow ledger is
            db.executescript(OLD_USAGE_TABLE)
        assert open_at_once(_open_ledger, (path, cluster), 6) == []
        with sqlite3.connect(path) as db:
            columns = [row[1] for row in db.execute("PRAGMA table_info(usage)")]
        assert columns.count("model") == 1


def test_a_lease_ended_by_a_process_that_does_not_know_its_nodes_keeps_its_model(
    tmp_path: Path,
) -> None:
    """A gang that named no model is placed on a node by a worker that knows the
    cluster file; the lease expires while a reader opened with another inventory (a
    shell's `tideflow usage` without the cluster file: this machine's devices only)
    reads the ledger. The usage row still names its model: it is recorded when the
    lease is placed, by the process that placed it."""
    day = Day(tmp_path)
    day.cluster.write_text(TWO_MODELS)
    placer = LeaseLedger(day.home / "leases.db", load_cluster(day.cluster), clock=lambda: day.now)
    day.at(0)
    loose = placer.try_acquire(
        GangRequest("det/run1/train", "vision", "gpu", None, 2, 1, 100), "test", HOUR
    )
    assert isinstance(loose, Lease) and loose.model is None
    (placed,) = [n.model for n in placer.inventory.nodes if n.name == loose.placements[0].node]
    elsewhere = tmp_path / "this-machine.yaml"
    elsewhere.write_text(
        "apiVersion: tideflow/v1\nkind: Cluster\nmetadata: {name: laptop}\nnodes:\n"
        "  - {name: laptop, count: 1, cpu: 8}\n"
    )
    reader = LeaseLedger(day.home / "leases.db", load_cluster(elsewhere), clock=lambda: day.now)
    day.at(1.5)  # the loose gang's lease has expired; the reader is the one to end it
    spans = {s.gang_id: s for s in reader.usage_spans(T0, day.now)}
    assert placed is not None
    assert (spans["det/run1/train"].ended_by, spans["det/run1/train"].model) == ("expired", placed)
