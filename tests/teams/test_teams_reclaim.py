"""Reclaim: a team below its nominal quota gets it back from any team above its own.

Kueue's ``reclaimWithinCohort`` (what ``tideflow compile --target kueue`` sets) pools
lending in the cohort: a ClusterQueue that fits within its nominal quota preempts
workloads of any ClusterQueue using more than its own nominal, whichever member's
quota the borrow was counted against, and only while that queue is still above it.
The ledger decides the same; which lender it attributed a borrow to only chooses the
grace. Real gangs stopped by such a reclaim are in ``tests/teams/test_teams_gangs.py``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tests.teams.test_teams import Clock, acquire, gang, refused, write
from tideflow.inventory import load_cluster
from tideflow.scheduling import LeaseLedger
from tideflow.scheduling.quota import Held, Teams, candidates, victims

# The user's cluster: six GPUs, each team's nominal two; prod's class does not preempt.
SHOP = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: shop}
nodes:
  - {name: n, count: 3, cpu: 8, accelerators: {class: gpu, model: T4, count: 2}}
priority_classes:
  - {name: normal, value: 100}
teams:
  - {name: prod, quota: [{device: gpu, nominal: 2}], default_priority_class: normal}
  - {name: research, quota: [{device: gpu, nominal: 2}], default_priority_class: normal}
  - name: batch
    quota: [{device: gpu, nominal: 2, borrowing_limit: 2}]
    default_priority_class: normal
borrowing:
  - {lender: research, borrower: batch, grace: 45s}
  - {lender: prod, borrower: research}
"""


# What the ledger says when prod reclaims its quota from batch, which sits above its own.
RECLAIM = "reclaimed for prod/serve, within its team's quota: team batch uses 4 of its 2"


def test_a_team_below_nominal_reclaims_from_a_borrower_of_another_lenders_quota(
    tmp_path: Path,
) -> None:
    clock = Clock()
    ledger = LeaseLedger(tmp_path / "l.db", load_cluster(write(tmp_path, SHOP)), clock=clock)
    acquire(ledger, gang("batch/own", "batch", 2))
    more = acquire(ledger, gang("batch/more", "batch", 2))
    assert (more.borrowed, more.lender) == (2, "research")
    # research takes its own quota back on the last free GPUs (prod's, physically):
    # nothing had to stop, and the ledger still counts batch/more against research
    assert acquire(ledger, gang("research/own", "research", 2)).borrowed == 0
    # prod, at 0 of its 2, asks: batch uses 4 of its 2 and must give 2 back
    why = refused(ledger, gang("prod/serve", "prod", 2)).reason
    assert why.startswith("stopping batch/more (checkpoint first)"), why
    assert RECLAIM in why, why
    (eviction,) = ledger.evictions()
    assert (eviction.gang_id, eviction.by_gang) == ("batch/more", "prod/serve")
    assert eviction.deadline == clock.now + 45  # the grace of batch's borrowing rule
    clock.now += 10
    ledger.release(more.lease_id)  # batch/more checkpointed and stopped
    assert acquire(ledger, gang("prod/serve", "prod", 2)).borrowed == 0
    assert ledger.lease_for("batch/own") is not None  # within batch's quota: untouched
    refused(ledger, gang("batch/more", "batch", 2))  # nothing idle to borrow back


def held(gang_id: str, team: str, borrowed: int, lender: str | None) -> Held:
    return Held(gang_id, team, "gpu", None, 2, 100, True, 0.0, borrowed, lender)


def test_reclaim_stops_once_the_borrower_is_back_at_its_nominal(tmp_path: Path) -> None:
    # Both of batch's gangs were counted as borrowing prod's quota when they started
    # (its own gang has ended since): batch uses 4 of its 2, so one of them goes back
    # and the other is then within batch's quota. prod would need both gone, so it
    # stops neither, as Kueue's reclaim, which preempts only a queue still borrowing.
    text = SHOP.replace(
        "nominal: 2}], default_priority_class: normal}\n  - {name: research",
        "nominal: 4}], default_priority_class: normal}\n  - {name: research",
    )
    text = text.replace("count: 3,", "count: 4,")
    teams = Teams.of(load_cluster(write(tmp_path, text)))
    assert teams is not None and teams.nominal("prod", ("gpu", None)) == 4
    leases = [held("batch/a", "batch", 2, "prod"), held("batch/b", "batch", 2, "prod")]
    request = gang("prod/serve", "prod", 4)

    def fits_without(gangs: frozenset[str]) -> bool:
        return len(gangs) == 2

    assert victims(teams, request, leases, now=0.0, fits_without=fits_without) == ()
    (one,) = victims(teams, request, leases, now=0.0, fits_without=bool)  # any one will do
    assert one.reason.startswith("reclaimed by its lender prod for prod/serve"), one.reason
    # batch/a already asked to stop (by another gang): batch/b is batch's own quota now
    leases[0] = replace(leases[0], evicting=True)
    assert victims(teams, request, leases, now=0.0, fits_without=lambda gangs: True) == ()


def test_only_a_lender_reclaims_when_the_quota_is_free_but_the_nodes_do_not_fit(
    tmp_path: Path,
) -> None:
    # Two GPUs of quota are free (the shared pool's); prod's gang would not fit on
    # them only for placement. Kueue admits such a workload without preempting, so
    # prod stops nobody who borrows another's quota; its own borrowers it does reclaim.
    teams = Teams.of(load_cluster(write(tmp_path, SHOP.replace("count: 3,", "count: 4,"))))
    assert teams is not None
    leases = [
        held("batch/own", "batch", 0, None),
        held("batch/more", "batch", 2, "research"),
        held("research/own", "research", 0, None),
    ]
    assert candidates(teams, gang("prod/serve", "prod", 2), leases, now=0.0) == []
    leases[1] = held("batch/more", "batch", 2, "prod")
    ((lease, why),) = candidates(teams, gang("prod/serve", "prod", 2), leases, now=0.0)
    assert lease.gang_id == "batch/more" and why.startswith("reclaimed by its lender prod")


def test_the_gang_reclaimed_for_a_waiting_team_cannot_borrow_the_quota_back(
    tmp_path: Path,
) -> None:
    # Two GPUs no team owns (the shared pool): batch borrows them first. A borrower of
    # the shared pool is reclaimed like any other (Kueue: the Cohort's own quota).
    # Stopped, it asks again before prod's lower-priority gang does and finds the pool
    # free; were it let borrow it, prod would reclaim it again, and again: it waits.
    text = SHOP.replace("count: 3,", "count: 4,").replace(
        "  - {name: normal, value: 100}\n",
        "  - {name: normal, value: 100}\n  - {name: low, value: 0}\n",
    )
    clock = Clock()
    ledger = LeaseLedger(tmp_path / "l.db", load_cluster(write(tmp_path, text)), clock=clock)
    acquire(ledger, gang("batch/own", "batch", 2))
    more = acquire(ledger, gang("batch/more", "batch", 2))
    assert (more.borrowed, more.lender) == (2, "")
    acquire(ledger, gang("research/own", "research", 2))
    kept = replace(gang("research/more", "research", 2), preemptible=False)
    assert acquire(ledger, kept).lender == "prod"
    serve = gang("prod/serve", "prod", 2, priority=0, klass="low")
    why = refused(ledger, serve).reason
    assert why.startswith("stopping batch/more (checkpoint first)"), why
    assert RECLAIM in why, why
    assert ledger.evictions()[0].deadline == clock.now + 300  # no rule: the default grace
    ledger.release(more.lease_id)
    why = refused(ledger, gang("batch/more", "batch", 2)).reason
    assert "other teams' gangs waiting within their quota leave 0 to borrow" in why, why
    assert acquire(ledger, serve).borrowed == 0
    assert ledger.evictions() == []
