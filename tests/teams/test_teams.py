"""Teams in the cluster file: validation at file:line, and the ledger's quota decisions.

The decisions run through the real ``LeaseLedger`` (SQLite, one transaction per
call) with a replayable clock; the gangs here are requests only. Real gangs on
the local backend, stopped and resumed by these decisions, are in
``tests/teams/test_teams_gangs.py``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.fakes import Clock
from tideflow.inventory import load_cluster
from tideflow.scheduling import GangRequest, Lease, LeaseLedger, Refusal
from tideflow.spec.errors import SpecError
from tideflow.spec.loader import load_pipeline

BANK = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: bank}
nodes:
  - {name: gpu, count: 10, cpu: 32, accelerators: {class: gpu, model: H100, count: 10}}
priority_classes:
  - {name: urgent, value: 1000, preempts: true}
  - {name: normal, value: 100}
  - {name: batch, value: 0}
teams:
  - name: risk
    quota: [{device: gpu, nominal: 40, borrowing_limit: 40}]
    default_priority_class: normal
  - name: marketing
    quota: [{device: gpu, nominal: 30, lending_limit: 24}]
    default_priority_class: normal
  - name: research
    quota: [{device: gpu, nominal: 30}]
    priority_classes: [normal, batch, urgent]
    default_priority_class: batch
borrowing:
  - {lender: marketing, borrower: risk, max_borrowable_ratio: 0.8, grace: 10m}
  - {lender: research, borrower: risk, max_borrowable_ratio: 0.5, min_priority_class: normal}
"""


def write(tmp_path: Path, text: str, name: str = "cluster.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def bank(tmp_path: Path) -> tuple[LeaseLedger, Clock]:
    clock = Clock()
    inventory = load_cluster(write(tmp_path, BANK))
    return LeaseLedger(tmp_path / "ledger.db", inventory, clock=clock), clock


def gang(
    gang_id: str,
    team: str,
    devices: int,
    priority: int = 100,
    klass: str = "normal",
    *,
    minimum: int | None = None,
) -> GangRequest:
    return GangRequest(
        gang_id,
        team,
        "gpu",
        None,
        devices,
        1,
        priority=priority,
        priority_class=klass,
        min_workers=minimum,
    )


def acquire(ledger: LeaseLedger, request: GangRequest) -> Lease:
    result = ledger.try_acquire(request, "test", 1e6)
    assert isinstance(result, Lease), result
    return result


def refused(ledger: LeaseLedger, request: GangRequest) -> Refusal:
    result = ledger.try_acquire(request, "test", 1e6)
    assert isinstance(result, Refusal), result
    return result


# -- the file -------------------------------------------------------------------------
def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        load_cluster(write(tmp_path, text))
    return [str(issue) for issue in caught.value.issues]


def test_the_bank_declaration_loads_with_its_rules(tmp_path: Path) -> None:
    spec = load_cluster(write(tmp_path, BANK)).teams
    assert spec is not None
    assert [t.name for t in spec.teams] == ["risk", "marketing", "research"]
    assert spec.borrowing[0].grace == 600
    assert spec.scheduling.reserve_after == 1800


def test_quotas_summing_over_the_inventory_are_refused_at_their_lines(tmp_path: Path) -> None:
    text = BANK.replace("nominal: 30, lending_limit: 24", "nominal: 31, lending_limit: 24")
    found = problems(tmp_path, text)
    assert any(
        "cluster.yaml:15:" in p and "teams[1].quota[0].nominal" in p and "sum to 101" in p
        and "the nodes declare 100" in p for p in found
    ), found  # fmt: skip


def test_a_class_wide_and_a_per_model_quota_share_the_same_devices(tmp_path: Path) -> None:
    text = BANK.replace("nominal: 30}]\n    priority_classes", "model: H100, nominal: 31}]\n"
                        "    priority_classes")  # fmt: skip
    found = problems(tmp_path, text)
    assert any("teams[2].quota[0].nominal" in p and "gpu quotas sum to 101" in p for p in found)


def test_unknown_teams_classes_and_cycles_are_named(tmp_path: Path) -> None:
    text = BANK.replace("{lender: marketing, borrower: risk", "{lender: marketting, borrower: risk")
    text += "  - {lender: risk, borrower: research}\n  - {lender: research, borrower: risk2}\n"
    text = text.replace("default_priority_class: batch", "default_priority_class: bulk")
    found = "\n".join(problems(tmp_path, text))
    assert (
        "borrowing[0].lender: unknown team 'marketting'; one of marketing, research, risk" in found
    )
    assert "teams[2].default_priority_class: unknown priority class 'bulk'" in found
    assert "borrowing[3].borrower: unknown team 'risk2'" in found
    assert "lending forms a cycle: research -> risk -> research" in found


def test_a_lending_limit_above_nominal_is_refused(tmp_path: Path) -> None:
    found = problems(tmp_path, BANK.replace("lending_limit: 24", "lending_limit: 31"))
    assert any("lending_limit 31 is above nominal 30" in p for p in found), found


def pipeline_file(tmp_path: Path, team: str, klass: str | None) -> Path:
    line = f"  priority_class: {klass}\n" if klass else ""
    text = (
        "apiVersion: tideflow/v1\nkind: Pipeline\nmetadata:\n  name: p\n"
        f"  team: {team}\n{line}steps:\n  - name: train\n"
        "    gang_training: {entrypoint: m:f, workers: 2, device: {class: gpu}}\n"
    )
    return write(tmp_path, text, "p.yaml")


def test_a_pipeline_must_name_a_declared_team_and_a_class_it_may_use(tmp_path: Path) -> None:
    inventory = load_cluster(write(tmp_path, BANK))
    load_pipeline(pipeline_file(tmp_path, "research", "urgent"), inventory)
    with pytest.raises(SpecError, match=r"p.yaml:5:9: metadata.team: team 'riks' is not "
                       r"declared in cluster file 'bank'; did you mean 'risk'\?"):  # fmt: skip
        load_pipeline(pipeline_file(tmp_path, "riks", None), inventory)
    with pytest.raises(SpecError, match=r"team 'risk' may not|unknown priority class 'asap'"):
        load_pipeline(pipeline_file(tmp_path, "risk", "asap"), inventory)


# -- scenario 4: borrowing idle quota, and giving it back -----------------------------
def test_a_team_borrows_idle_quota_within_the_rules(bank: tuple[LeaseLedger, Clock]) -> None:
    ledger, _ = bank
    for i in range(4):
        assert acquire(ledger, gang(f"risk/{i}", "risk", 10)).borrowed == 0
    # marketing lends at most 24 (its lending_limit) of 30; research 15 (ratio 0.5)
    first = acquire(ledger, gang("risk/4", "risk", 20))
    assert (first.borrowed, first.lender) == (20, "marketing")
    second = acquire(ledger, gang("risk/5", "risk", 15))
    assert (second.borrowed, second.lender) == (15, "research")
    why = refused(ledger, gang("risk/6", "risk", 5)).reason
    assert "team risk uses 75 of its 40 gpu quota" in why
    assert "borrows 35 of at most 40" in why and "marketing 4" in why and "research 0" in why


def test_a_borrow_below_the_lenders_priority_threshold_is_refused(
    bank: tuple[LeaseLedger, Clock],
) -> None:
    ledger, _ = bank
    acquire(ledger, gang("risk/own", "risk", 40))
    acquire(ledger, gang("marketing/own", "marketing", 30))
    why = refused(ledger, gang("risk/batch", "risk", 5, priority=0, klass="batch")).reason
    assert "priority 0 is below what research lend(s) to" in why


def test_the_lender_reclaims_its_quota_and_the_borrower_cannot_take_it_back(
    bank: tuple[LeaseLedger, Clock],
) -> None:
    ledger, clock = bank
    acquire(ledger, gang("risk/own", "risk", 40))
    borrowed = acquire(ledger, gang("risk/b", "risk", 20))
    acquire(ledger, gang("research/own", "research", 30))
    acquire(ledger, gang("marketing/a", "marketing", 10))
    # marketing now needs 20 more of its 30: 10 idle? no: risk holds 20 of them
    why = refused(ledger, gang("marketing/b", "marketing", 20)).reason
    assert why.startswith("stopping risk/b (checkpoint first)"), why
    assert "reclaimed by its lender marketing" in why
    (eviction,) = ledger.evictions()
    assert (eviction.gang_id, eviction.by_gang) == ("risk/b", "marketing/b")
    assert eviction.deadline == clock.now + 600  # the rule's grace
    # asking again does not pick more victims; it waits for the one it chose
    assert "waiting for risk/b" in refused(ledger, gang("marketing/b", "marketing", 20)).reason
    clock.now += 30
    ledger.release(borrowed.lease_id)  # risk/b checkpointed and stopped
    # it asks again at once, but the lender's waiting demand is not lent out again
    why = refused(ledger, gang("risk/b", "risk", 20)).reason
    assert "marketing 0" in why, why
    assert acquire(ledger, gang("marketing/b", "marketing", 20)).borrowed == 0
    journal = [(e.gang_id, e.action) for e in ledger.journal()]
    assert ("risk/b", "evict") in journal and ("risk/b", "preempted") in journal
    spans = {s.gang_id: s for s in ledger.usage_spans(0)}
    assert spans["risk/b"].ended_by == "preempted" and spans["risk/b"].borrowed == 20


def test_the_journal_is_filtered_by_action_in_the_ledger(
    bank: tuple[LeaseLedger, Clock],
) -> None:
    ledger, clock = bank
    acquire(ledger, gang("risk/own", "risk", 40))
    borrowed = acquire(ledger, gang("risk/b", "risk", 20))
    acquire(ledger, gang("research/own", "research", 30))
    acquire(ledger, gang("marketing/a", "marketing", 10))
    refused(ledger, gang("marketing/b", "marketing", 20))  # risk/b is asked to stop
    clock.now += 30
    ledger.release(borrowed.lease_id)
    acquire(ledger, gang("marketing/b", "marketing", 20))
    for i in range(5):  # newer decisions of other kinds
        clock.now += 1
        refused(ledger, gang(f"research/w{i}", "research", 10))
    stops = ("evict", "preempted", "forced")
    everything = ledger.journal(limit=1000)
    assert {"admit", "wait", "evict", "preempted"} <= {e.action for e in everything}
    picked = ledger.journal(limit=1000, actions=stops)
    assert [(e.gang_id, e.action) for e in picked] == [("risk/b", "evict"), ("risk/b", "preempted")]
    assert picked == [e for e in everything if e.action in stops]
    # the limit counts the chosen actions only (the newest 2 rows are waits)
    assert all(e.action == "wait" for e in ledger.journal(limit=2))
    assert ledger.journal(limit=1, actions=stops) == picked[-1:]
    assert ledger.journal(picked[-1].at, actions={"evict"}) == []
    assert ledger.journal(actions=()) == []


def test_a_gang_that_asks_again_is_seen_as_it_asks_now(bank: tuple[LeaseLedger, Clock]) -> None:
    # The ledger parses a stored request or lease once, keyed by its stored text: a
    # gang's new request under the same id, and a renewed lease, are new texts.
    ledger, clock = bank
    lease = acquire(ledger, gang("risk/own", "risk", 40))
    acquire(ledger, gang("marketing/own", "marketing", 30))
    acquire(ledger, gang("research/own", "research", 30))
    refused(ledger, gang("risk/w", "risk", 20))
    refused(ledger, gang("risk/w", "risk", 10, minimum=5))
    assert [(r.devices, r.min_workers) for r, _ in ledger.waiting()] == [(10, 5)]
    clock.now += 60
    renewed = ledger.renew(lease.lease_id, 1e6)
    assert renewed.expires_at == clock.now + 1e6 > lease.expires_at
    assert ledger.lease_for("risk/own") == renewed


def test_a_gang_within_its_own_quota_is_never_stopped_for_another_team(
    bank: tuple[LeaseLedger, Clock],
) -> None:
    ledger, _ = bank
    acquire(ledger, gang("risk/own", "risk", 40))
    acquire(ledger, gang("marketing/own", "marketing", 30))
    acquire(ledger, gang("research/own", "research", 30, priority=0, klass="batch"))
    why = refused(ledger, gang("risk/urgent", "risk", 10, priority=1000, klass="urgent")).reason
    assert ledger.evictions() == [] or all(e.gang_id == "risk/own" for e in ledger.evictions()), (
        ledger.evictions()
    )
    assert "research/own" not in why and "marketing/own" not in why


# -- scenario 5: an urgent gang preempts the long run of its own team --------------------
def test_an_urgent_gang_preempts_the_cheapest_lower_priority_gangs(
    bank: tuple[LeaseLedger, Clock],
) -> None:
    ledger, clock = bank
    long_run = acquire(ledger, gang("research/long", "research", 20, priority=0, klass="batch"))
    clock.now += 3600
    acquire(ledger, gang("research/recent", "research", 10, priority=0, klass="batch"))
    acquire(ledger, gang("risk/all", "risk", 40))
    acquire(ledger, gang("marketing/all", "marketing", 30))
    clock.now += 60
    # 10 devices: the gang with the least work at risk goes, not the two-week run
    why = refused(ledger, gang("research/urgent", "research", 10, 1000, "urgent")).reason
    assert why.startswith("stopping research/recent"), why
    assert "preempted by research/urgent (priority 1000)" in why
    # 20 devices for a second urgent gang: the long run too
    refused(ledger, gang("research/urgent2", "research", 20, 1000, "urgent"))
    assert {e.gang_id for e in ledger.evictions()} == {"research/recent", "research/long"}
    ledger.release(long_run.lease_id)  # the long run checkpointed and stopped
    # the first urgent gang fits in what the long run freed: research/recent, not yet
    # asked to stop, keeps running; the second one now needs it gone
    assert acquire(ledger, gang("research/urgent", "research", 10, 1000, "urgent"))
    assert ledger.evictions() == []
    why = refused(ledger, gang("research/urgent2", "research", 20, 1000, "urgent")).reason
    assert why.startswith("stopping research/recent"), why
    assert (
        "waiting for research/recent"
        in refused(ledger, gang("research/urgent2", "research", 20, 1000, "urgent")).reason
    )
    # the preempted long run asks again and waits behind the urgent gang
    why = refused(ledger, gang("research/long", "research", 20, priority=0, klass="batch"))
    assert "research/urgent2" in why.reason or "quota" in why.reason, why


def test_a_gang_already_asked_to_stop_is_not_chosen_again(
    bank: tuple[LeaseLedger, Clock],
) -> None:
    ledger, clock = bank
    for name in ("research/a", "research/b", "research/c"):  # c: least work at risk
        acquire(ledger, gang(name, "research", 10, priority=0, klass="batch"))
        clock.now += 600
    acquire(ledger, gang("risk/all", "risk", 40))
    acquire(ledger, gang("marketing/all", "marketing", 30))
    why = refused(ledger, gang("research/u1", "research", 10, 1000, "urgent")).reason
    assert why.startswith("stopping research/c"), why
    why = refused(ledger, gang("research/u2", "research", 10, 1000, "urgent")).reason
    assert why.startswith("stopping research/b"), why
    assert {(e.gang_id, e.by_gang) for e in ledger.evictions()} == {
        ("research/c", "research/u1"),
        ("research/b", "research/u2"),
    }


def test_a_class_without_preempts_never_stops_anyone(bank: tuple[LeaseLedger, Clock]) -> None:
    ledger, _ = bank
    acquire(ledger, gang("research/long", "research", 30, priority=0, klass="batch"))
    refused(ledger, gang("research/normal", "research", 10, priority=100))
    assert ledger.evictions() == []


# -- reservation, fair sharing, auto return ---------------------------------------------
def test_a_gang_that_waits_for_its_quota_reserves_nothing(
    bank: tuple[LeaseLedger, Clock],
) -> None:
    ledger, clock = bank
    smalls = [acquire(ledger, gang(f"risk/s{i}", "risk", 10)) for i in range(4)]
    refused(ledger, gang("risk/big", "risk", 40))
    for _ in range(61):  # it keeps asking, as its trigger does
        clock.now += 30
        refused(ledger, gang("risk/big", "risk", 40))
    ledger.release(smalls[0].lease_id)
    # risk's quota holds risk/big back, not room on nodes: the 10 that freed go to a
    # gang of its team (held for it, they would stay idle until all 40 are free)
    assert acquire(ledger, gang("risk/s9", "risk", 10)).devices == 10
    for lease in smalls[1:]:
        ledger.release(lease.lease_id)
    ledger.release(ledger.lease_for("risk/s9").lease_id)  # type: ignore[union-attr]
    assert acquire(ledger, gang("risk/big", "risk", 40)).devices == 40


def shaped(gang_id: str, team: str, workers: int, per: int, priority: int = 100) -> GangRequest:
    klass = "normal" if priority == 100 else "batch"
    return GangRequest(
        gang_id, team, "gpu", None, workers, per, priority=priority, priority_class=klass
    )


def _big_waits_for_nodes(ledger: LeaseLedger, clock: Clock) -> GangRequest:
    """risk/big (two whole nodes) waits past reserve_after for nodes, not for quota.

    Eight nodes carry one 8-GPU gang each (2 free), gpu-8 a 6-GPU gang (4 free),
    gpu-9 is empty: 28 GPUs free but only one whole node. Risk uses 16 of its 40.
    """
    for i, team in enumerate(["marketing"] * 3 + ["research"] * 3 + ["risk"] * 2):
        assert acquire(ledger, shaped(f"{team}/n{i}", team, 1, 8)).nodes == (f"gpu-{i}",)
    assert acquire(ledger, shaped("marketing/six", "marketing", 1, 6)).nodes == ("gpu-8",)
    big = shaped("risk/big", "risk", 2, 10)
    refused(ledger, big)
    for _ in range(61):  # it keeps asking, as its trigger does
        clock.now += 30
        refused(ledger, big)
    return big


def test_a_reservation_holds_nodes_and_its_team_backfills_the_others(
    bank: tuple[LeaseLedger, Clock],
) -> None:
    ledger, clock = bank
    big = _big_waits_for_nodes(ledger, clock)
    # The nodes where risk/big starts soonest: the most free devices (gpu-9's 10,
    # gpu-8's 4). A small gang of its own team that fits elsewhere starts there.
    small = acquire(ledger, shaped("risk/small", "risk", 1, 2))
    assert small.nodes == ("gpu-0",)
    # One that fits only on a held node waits, and says which nodes and for whom.
    why = refused(ledger, shaped("risk/four", "risk", 1, 4)).reason
    assert "gpu-8, gpu-9" in why and "reserved for risk/big, which has waited 1830s" in why
    clock.now += 30
    refused(ledger, shaped("risk/four", "risk", 1, 4))  # the same reason, 30 s later
    waits = [e.reason for e in ledger.journal() if e.gang_id == "risk/four"]
    assert len(waits) == 1 and "gpu-8, gpu-9" in waits[0], waits  # when it changes only
    # risk/four, queued first, is not about to start: it does not hold back a gang
    # behind it that fits off the held nodes.
    clock.now += 1
    assert acquire(ledger, shaped("risk/two", "risk", 1, 2)).nodes == ("gpu-1",)
    ledger.release(ledger.lease_for("marketing/six").lease_id)  # type: ignore[union-attr]
    refused(ledger, shaped("risk/four", "risk", 1, 4))  # gpu-8 is empty now: still held
    assert acquire(ledger, big).nodes == ("gpu-8", "gpu-9")


def test_another_teams_gang_behind_it_stays_off_the_held_nodes_one_ahead_does_not(
    bank: tuple[LeaseLedger, Clock],
) -> None:
    ledger, clock = bank
    _big_waits_for_nodes(ledger, clock)
    # research is within its quota (24 of 30), but a gang of it queued after risk/big
    # at its priority fits only on the held nodes: it waits until risk/big starts.
    why = refused(ledger, shaped("research/four", "research", 1, 4)).reason
    assert "gpu-8, gpu-9 reserved for risk/big" in why, why
    assert acquire(ledger, shaped("research/two", "research", 1, 2)).nodes == ("gpu-0",)
    # A gang of higher priority is ahead of risk/big: nothing is held against it.
    urgent = GangRequest(
        "research/urgent", "research", "gpu", None, 1, 4, priority=1000, priority_class="urgent"
    )
    assert acquire(ledger, urgent).nodes == ("gpu-8",)


def test_a_reserved_gang_keeps_the_quota_it_needs(bank: tuple[LeaseLedger, Clock]) -> None:
    ledger, clock = bank
    _big_waits_for_nodes(ledger, clock)
    # risk uses 16 of 40; risk/big needs 20, of which it may borrow 6 now (marketing's
    # idle 6): its team's small gangs start while 20 are left for it, then wait.
    for i in range(5):
        acquire(ledger, shaped(f"risk/s{i}", "risk", 1, 2))
    why = refused(ledger, shaped("risk/s5", "risk", 1, 2)).reason
    assert "reserved for risk/big" in why and "quota" in why, why


def test_fair_sharing_puts_the_team_with_the_smaller_share_first(tmp_path: Path) -> None:
    text = BANK.split("borrowing:", maxsplit=1)[0] + (
        "borrowing:\n  - {lender: marketing, borrower: risk}\n"
        "  - {lender: marketing, borrower: research}\n"
    )
    clock = Clock()
    ledger = LeaseLedger(tmp_path / "l.db", load_cluster(write(tmp_path, text)), clock=clock)
    acquire(ledger, gang("risk/own", "risk", 40))
    acquire(ledger, gang("research/own", "research", 20, klass="normal"))
    acquire(ledger, gang("m/own", "marketing", 30))
    # risk (40 of 40 used) queues first, research (20 of 30) second: both must borrow
    refused(ledger, gang("risk/more", "risk", 10))
    clock.now += 1
    refused(ledger, gang("research/more", "research", 20, klass="normal"))
    ledger.release(ledger.lease_for("m/own").lease_id)  # type: ignore[union-attr]
    why = refused(ledger, gang("risk/more", "risk", 10)).reason
    assert "research/more waits ahead of it" in why, why
    acquire(ledger, gang("research/more", "research", 20, klass="normal"))


def test_after_auto_return_timeout_any_waiting_team_reclaims(tmp_path: Path) -> None:
    text = BANK.replace("grace: 10m}", "grace: 10m, auto_return_timeout: 1h}")
    text += "  - {lender: marketing, borrower: research}\n"
    clock = Clock()
    ledger = LeaseLedger(tmp_path / "l.db", load_cluster(write(tmp_path, text)), clock=clock)
    acquire(ledger, gang("risk/own", "risk", 40))
    acquire(ledger, gang("risk/b", "risk", 20))  # borrows 20 of marketing's
    acquire(ledger, gang("research/own", "research", 30, klass="normal"))
    acquire(ledger, gang("m/own", "marketing", 10))
    refused(ledger, gang("research/more", "research", 10, klass="normal"))
    assert ledger.evictions() == []  # research is not the lender, the borrow is young
    clock.now += 3601
    why = refused(ledger, gang("research/more", "research", 10, klass="normal")).reason
    assert "past its auto_return_timeout of 3600s" in why, why


def test_an_elastic_gang_starts_smaller_within_its_quota(bank: tuple[LeaseLedger, Clock]) -> None:
    ledger, _ = bank
    acquire(ledger, gang("research/a", "research", 24, priority=0, klass="batch"))
    lease = acquire(ledger, gang("research/e", "research", 10, 0, "batch", minimum=4))
    assert lease.devices == 6 and lease.borrowed == 0


def test_a_gang_larger_than_quota_and_borrowable_never_fits(
    bank: tuple[LeaseLedger, Clock],
) -> None:
    ledger, _ = bank
    result = refused(ledger, gang("marketing/huge", "marketing", 50))
    assert result.never and "more than team marketing can ever get" in result.reason


def test_without_teams_the_ledger_keeps_one_shared_pool(tmp_path: Path) -> None:
    text = BANK.split("priority_classes:", maxsplit=1)[0]
    ledger = LeaseLedger(tmp_path / "l.db", load_cluster(write(tmp_path, text)), clock=Clock())
    assert ledger.teams is None
    assert acquire(ledger, gang("anyone/all", "anyone", 100)).devices == 100
