"""Teams replayed through the real lease ledger on a simulated clock.

Scenario 4 (a bank's month end: risk needs far more than its 40 GPUs while
marketing uses a fifth of its 30) and scenario 5 (an urgent model while a
two-week run holds the GPUs), small enough to run in seconds; the figures at
full size are bench/teams.py's.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

import tideflow.scheduling.state as ledger_state
from research.scheduling.replay import Replay, replay
from research.scheduling.streams import (
    DAY,
    HOUR,
    Job,
    bank_spec,
    month_end_stream,
    static_quotas,
    urgent_stream,
)
from tideflow.inventory import ClusterSpec, Inventory
from tideflow.scheduling import GangRequest, Lease, LeaseLedger

pytestmark = pytest.mark.research


def _specs() -> dict[str, ClusterSpec]:
    spec = bank_spec(reserve_after=None)
    return {"static": static_quotas(spec), "tideflow": spec}


def test_static_quotas_lend_nothing_and_preempt_nobody() -> None:
    static = static_quotas(bank_spec())
    assert static.borrowing == ()
    assert not any(c.preempts for c in static.priority_classes)
    assert [t.quota for t in static.teams] == [t.quota for t in bank_spec().teams]


@pytest.mark.parametrize("policy", ["static", "tideflow"])
def test_every_gang_finishes_and_device_time_is_conserved(policy: str) -> None:
    jobs = month_end_stream(2, days=4, burst_days=2)
    run = Replay(_specs()[policy], jobs, policy=policy)
    result = run.run(4 * DAY)  # raises on a device granted twice or a gang left behind
    run.check_conservation()  # ledger device-time == the gangs'; work + lost + overhead
    assert all(o.finished is not None for o in result.outcomes.values())
    assert run.claimed == {} and run.ledger.used_devices() == {}
    assert run.ledger.leases() == [] and run.ledger.waiting() == []
    if policy == "static":
        assert all(f.borrowed_device_h == 0 and f.preemptions == 0 for f in result.teams.values())


def test_borrowing_shortens_risk_queue_at_month_end() -> None:
    jobs = month_end_stream(2, days=4, burst_days=2)
    static, tideflow = (
        replay(spec, jobs, policy=name, window_s=4 * DAY) for name, spec in _specs().items()
    )
    assert tideflow.teams["risk"].borrowed_device_h > 0
    assert tideflow.teams["risk"].queue_mean_h < static.teams["risk"].queue_mean_h
    assert tideflow.teams["risk"].cluster_share > static.teams["risk"].cluster_share
    # Nothing lends to marketing or research.
    assert tideflow.teams["marketing"].borrowed_device_h == 0
    assert tideflow.teams["research"].borrowed_device_h == 0


@pytest.mark.parametrize("save_s", [120.0, None], ids=["checkpoint-on-signal", "periodic-only"])
def test_urgent_gang_preempts_long_run_which_loses_at_most_one_interval(
    save_s: float | None,
) -> None:
    jobs = urgent_stream(1, days=2, urgent_at_s=DAY, long_save_s=save_s)
    result = replay(bank_spec(reserve_after=None), jobs, policy="tideflow", window_s=6 * DAY)
    urgent, long_run = result.outcome("risk-urgent"), result.outcome("risk-long-run")
    assert urgent.finished is not None and urgent.job.deadline_s is not None
    assert urgent.finished <= urgent.job.deadline_s
    assert long_run.preemptions >= 1 and long_run.finished is not None
    assert long_run.lost_s <= long_run.job.checkpoint_every_s
    if save_s is not None:
        assert long_run.lost_s == 0 and long_run.forced == 0


def test_without_preemption_the_urgent_model_misses_its_deadline() -> None:
    jobs = urgent_stream(1, days=2, urgent_at_s=DAY)
    waited = replay(
        static_quotas(bank_spec(reserve_after=None)), jobs, policy="static", window_s=6 * DAY
    )
    urgent = waited.outcome("risk-urgent")
    assert urgent.finished is not None and urgent.job.deadline_s is not None
    assert urgent.finished > urgent.job.deadline_s
    killed = replay(
        static_quotas(bank_spec(reserve_after=None)),
        jobs,
        policy="static-kill",
        window_s=6 * DAY,
        kills={"risk-long-run": urgent.job.arrival_s},
    )
    assert killed.outcome("risk-long-run").lost_s == pytest.approx(
        urgent.job.arrival_s - 300.0  # all its run since it loaded: a day
    )


def test_forced_stop_loses_only_work_since_its_checkpoint() -> None:
    # A gang that cannot checkpoint on a signal and checkpoints every 4 h is stopped at
    # the end of its 5-minute grace: it loses what it did since its last checkpoint.
    long_run = Job("risk-a", "risk", 0.0, 4, 10, 2 * DAY, "normal", 4 * HOUR, None, 0.0)
    urgent = Job("risk-b", "risk", 5 * HOUR, 4, 10, HOUR, "urgent", restart_s=0.0)
    # The other teams fill the rest of the cluster within their own quotas: untouchable.
    rest = [
        Job(f"{team}-{i}", team, 0.0, 1, 10, 2 * DAY)
        for team in ("marketing", "research")
        for i in range(3)
    ]
    result = replay(
        bank_spec(reserve_after=None), [long_run, urgent, *rest], policy="t", window_s=3 * DAY
    )
    victim = result.outcome("risk-a")
    assert result.outcome("risk-b").first_start == pytest.approx(5 * HOUR + 300)
    assert victim.forced == 1 and victim.lost_s == pytest.approx(HOUR + 300)


def _decisions(spec: ClusterSpec, jobs: list[Job], window_s: float) -> list[tuple[object, ...]]:
    run = Replay(spec, jobs, policy="tideflow")
    result = run.run(window_s)
    journal = [(e.at, e.gang_id, e.action, e.reason) for e in run.ledger.journal(0.0, 10**9)]
    starts = sorted(
        (g, o.first_start, o.finished, o.runs, o.preemptions, o.forced, o.lost_s)
        for g, o in result.outcomes.items()
    )
    return [*journal, *starts]


@pytest.mark.parametrize(
    "case",
    ["month-end, reserve_after declared", "urgent model, periodic checkpoints only"],
)
def test_the_parse_cache_changes_no_decision(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The ledger parses each stored request and lease row once (a cache keyed by the
    # stored text); the same seeded stream must be decided the same way without it.
    if case.startswith("month-end"):
        spec, jobs, window = bank_spec(), month_end_stream(2, days=4, burst_days=2), 4 * DAY
    else:
        spec = bank_spec(reserve_after=None)
        jobs = urgent_stream(1, days=2, urgent_at_s=DAY, long_save_s=None)
        window = 6 * DAY
    hits = ledger_state._cached_request.cache_info().hits
    cached = _decisions(spec, jobs, window)
    assert ledger_state._cached_request.cache_info().hits > hits  # it was used
    monkeypatch.setattr(ledger_state, "PARSE_CACHE", False)
    info = (ledger_state._cached_request.cache_info(), ledger_state._cached_held.cache_info())
    parsed = _decisions(spec, jobs, window)
    assert (
        ledger_state._cached_request.cache_info(),
        ledger_state._cached_held.cache_info(),
    ) == info
    if case.startswith("urgent"):  # the victims' order reads their work at risk
        assert any(row[2] == "evict" for row in cached if len(row) == 4)
    assert cached == parsed


# -- the ledger's policy, as the replay found it ----------------------------------------
def _one_team_ledger(tmp: str, data: dict[str, object], now: list[float]) -> LeaseLedger:
    spec = ClusterSpec.model_validate(
        {
            "apiVersion": "tideflow/v1",
            "kind": "Cluster",
            "metadata": {"name": "c"},
            "nodes": [
                {
                    "name": "gpu",
                    "count": 2,
                    "cpu": 8,
                    "accelerators": {"class": "gpu", "model": "H100", "count": 8},
                }
            ],
            **data,
        }
    )
    # waiter_timeout_s: as if each waiter polled every few seconds, as triggers do.
    return LeaseLedger(
        Path(tmp) / "l.db", Inventory.from_spec(spec), clock=lambda: now[0], waiter_timeout_s=1e9
    )


def test_two_gangs_past_reserve_after_do_not_stall_each_other() -> None:
    now = [0.0]
    with tempfile.TemporaryDirectory() as tmp:
        book = _one_team_ledger(
            tmp, {"teams": [{"name": "a", "quota": [{"device": "gpu", "nominal": 16}]}]}, now
        )
        big = book.try_acquire(GangRequest("big", "a", "gpu", None, 2, 8), "h", 1e9)
        assert isinstance(big, Lease)
        x, y = (GangRequest(g, "a", "gpu", None, 1, 4) for g in ("x", "y"))
        book.try_acquire(x, "h", 1e9)
        book.try_acquire(y, "h", 1e9)
        now[0] = 1801.0
        book.release(big.lease_id)
        granted = [isinstance(book.try_acquire(r, "h", 1e9), Lease) for r in (x, y, x, y)]
        assert any(granted)


def test_lenders_own_gang_is_not_held_behind_a_borrower_that_cannot_borrow() -> None:
    now = [0.0]
    with tempfile.TemporaryDirectory() as tmp:
        book = _one_team_ledger(
            tmp,
            {
                "priority_classes": [
                    {"name": "normal", "value": 100},
                    {"name": "batch", "value": 0},
                ],
                "teams": [
                    {"name": "risk", "quota": [{"device": "gpu", "nominal": 8}]},
                    {"name": "research", "quota": [{"device": "gpu", "nominal": 8}]},
                ],
                "borrowing": [{"lender": "research", "borrower": "risk"}],
            },
            now,
        )
        own = GangRequest("risk-own", "risk", "gpu", None, 1, 8, 100, priority_class="normal")
        first = GangRequest("research-a", "research", "gpu", None, 1, 8, 0, priority_class="batch")
        assert isinstance(book.try_acquire(own, "h", 1e9), Lease)
        research = book.try_acquire(first, "h", 1e9)
        assert isinstance(research, Lease)
        borrower = GangRequest("risk-b", "risk", "gpu", None, 1, 8, 100, priority_class="normal")
        second = GangRequest("research-b", "research", "gpu", None, 1, 8, 0, priority_class="batch")
        book.try_acquire(second, "h", 1e9)
        book.try_acquire(borrower, "h", 1e9)
        now[0] = 10.0
        book.release(research.lease_id)  # research's own 8 GPUs are free again
        book.try_acquire(borrower, "h", 1e9)
        assert isinstance(book.try_acquire(second, "h", 1e9), Lease)


def _two_teams(
    nodes: int, quotas: dict[str, int], reserve_after: str | None = "30m"
) -> ClusterSpec:
    return ClusterSpec.model_validate(
        {
            "apiVersion": "tideflow/v1",
            "kind": "Cluster",
            "metadata": {"name": "c"},
            "nodes": [
                {
                    "name": "n",
                    "count": nodes,
                    "cpu": 8,
                    "accelerators": {"class": "gpu", "model": "H100", "count": 10},
                }
            ],
            "teams": [
                {"name": team, "quota": [{"device": "gpu", "nominal": n}]}
                for team, n in quotas.items()
            ],
            "scheduling": {"reserve_after": reserve_after},
        }
    )


def test_a_reserved_large_gang_starts_once_its_held_nodes_drain() -> None:
    # Six nodes of 10; team b runs a 6-GPU gang on every node (4 free on each) and
    # keeps more queued, so a node that empties is refilled at once and two empty
    # nodes never come by themselves. Team a's 20-GPU gang (two whole nodes) arrives
    # just after b's first gangs.
    work = 3 * HOUR  # the longest run of any gang here
    b = [Job(f"b-{i:03d}", "b", i * 1200.0, 1, 6, work - (i % 5) * 900.0) for i in range(96)]
    b = [Job(f"b-x{i}", "b", 0.0, 1, 6, work - 700.0 - i * 1000.0) for i in range(5)] + b
    big = Job("a-big", "a", 60.0, 2, 10, HOUR)
    spec = _two_teams(6, {"a": 24, "b": 36})
    result = replay(spec, [big, *b], policy="t", window_s=4 * DAY)
    # From reserve_after on, no gang queued behind it lands on the nodes held for it
    # (the two with the most free devices: here the first two that b's gangs leave),
    # so it starts at the latest when the runs on them then end (3 h, plus reload).
    held_from = big.arrival_s + 1800.0
    started = result.outcome("a-big").first_start
    assert started is not None and started <= held_from + work + 60.0, started / HOUR
    # Without reservations it waits until b's queue runs dry.
    spec = _two_teams(6, {"a": 24, "b": 36}, reserve_after=None)
    unreserved = replay(spec, [big, *b], policy="t", window_s=4 * DAY).outcome("a-big")
    assert (unreserved.first_start or 0) > 12 * HOUR
