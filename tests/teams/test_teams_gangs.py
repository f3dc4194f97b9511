"""Scenarios 4 and 5 with real gangs on the local backend.

Scenario 4 (elastic quotas): risk borrows marketing's idle GPUs for a digits
gang; marketing needs them back, so the ledger asks the borrowing gang to
stop, it checkpoints (exit 75) and its devices go to marketing; risk cannot
borrow them straight back; when marketing is done, risk borrows again and the
gang resumes, ending bitwise equal to an uninterrupted run.

Scenario 5 (priority preemption): a long batch run of research holds the
team's GPUs; an urgent gang of the same team asks through the operator's own
``LeaseTrigger`` poll, which carries out the eviction; the long run
checkpoints and waits behind the urgent gang; when it ends, the long run is granted
its GPUs again (the resume itself is scenario 4's).

Reclaim whichever lender's GPUs a borrower sits on: risk borrows marketing's,
marketing takes its own quota on research's idle node, and research reclaims its
quota from risk's borrowing gang, which checkpoints and stops.

The GPUs are declared (three two-GPU nodes) and emulated on the CPU; the gangs
that take the reclaimed devices hold leases only (no processes), which keeps
the test within two cores.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from operators.triggers import LeaseTrigger
from tests.checkpoints.test_runtime_distributed import (
    assert_same,
    final_weights,
    job,
    reference,
    splits,
    wait_for_step,
)
from tideflow.backends import GangState
from tideflow.backends.local import LocalBackend
from tideflow.checkpoint import CheckpointManager
from tideflow.gangs import enforce_evictions, request_to_dict
from tideflow.inventory import load_cluster
from tideflow.scheduling import GangRequest, Lease, LeaseLedger, Refusal

pytestmark = pytest.mark.processes

__all__ = ["reference", "splits"]  # fixtures shared with the CPU gang tests

LAB = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: lab}
nodes:
  - {name: n, count: 3, cpu: 8, accelerators: {class: gpu, model: T4, count: 2}}
priority_classes:
  - {name: urgent, value: 1000, preempts: true}
  - {name: normal, value: 100}
  - {name: batch, value: 0}
teams:
  - {name: risk, quota: [{device: gpu, nominal: 2}], default_priority_class: normal}
  - {name: marketing, quota: [{device: gpu, nominal: 2}], default_priority_class: normal}
  - {name: research, quota: [{device: gpu, nominal: 2}], default_priority_class: batch}
borrowing:
  - {lender: marketing, borrower: risk, grace: 2m}
"""


def lab(tmp_path: Path) -> tuple[Path, LeaseLedger, LocalBackend]:
    cluster = tmp_path / "lab.yaml"
    cluster.write_text(LAB)
    ledger = LeaseLedger(tmp_path / "leases.db", load_cluster(cluster))
    return cluster, ledger, LocalBackend(tmp_path / "gangs")


def request(gang_id: str, team: str, priority: int, klass: str) -> GangRequest:
    return GangRequest(gang_id, team, "gpu", None, 2, 1, priority=priority, priority_class=klass)


def stop_for(ledger: LeaseLedger, backend: LocalBackend, gang_id: str) -> None:
    """Carry out the ledger's evictions until ``gang_id`` has stopped and given back."""
    steps = [s.action for s in enforce_evictions(ledger, backend)]
    assert steps == ["asked"], steps
    status = backend.wait(gang_id, 120)
    assert status.state is GangState.PREEMPTED and status.exit_codes == (75, 75)
    assert [s.action for s in enforce_evictions(ledger, backend)] == ["stopped"]
    assert ledger.lease_for(gang_id) is None


def test_scenario_4_borrowed_gpus_are_reclaimed_with_a_checkpoint_and_resume_exactly(
    splits: dict[str, str], reference: tuple[int, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    _, ledger, backend = lab(tmp_path)
    checkpoints = (tmp_path / "ckpt").as_uri()
    # risk runs within its quota; research's GPUs are busy too
    for steady in (
        request("risk/own", "risk", 100, "normal"),
        request("research/steady", "research", 0, "batch"),
    ):
        assert isinstance(ledger.try_acquire(steady, "t", 600), Lease)
    burst = request("risk/month-end", "risk", 100, "normal")
    lease = ledger.try_acquire(burst, "operator", 600)
    assert isinstance(lease, Lease) and (lease.borrowed, lease.lender) == (2, "marketing")
    backend.submit(job(burst.gang_id, splits, checkpoints, step_delay=0.02, device_class="gpu"))
    wait_for_step(backend.log_path(burst.gang_id), 45)

    # Marketing needs its quota back: the cluster is full, so the borrower must go.
    marketing = request("marketing/campaign", "marketing", 100, "normal")
    why = ledger.try_acquire(marketing, "operator", 600)
    assert isinstance(why, Refusal)
    assert "stopping risk/month-end (checkpoint first)" in why.reason
    assert "reclaimed by its lender marketing" in why.reason
    stop_for(ledger, backend, burst.gang_id)
    stopped = CheckpointManager(checkpoints).latest()
    assert stopped is not None and stopped.step >= 45  # checkpointed on notice
    granted = ledger.try_acquire(marketing, "operator", 600)
    assert isinstance(granted, Lease) and granted.borrowed == 0

    # Risk asks again at once: nothing of marketing's is idle now, and it waits.
    again = ledger.try_acquire(burst, "operator", 600)
    assert isinstance(again, Refusal) and "marketing 0" in again.reason
    ledger.release(granted.lease_id)
    resumed = ledger.try_acquire(burst, "operator", 600)
    assert isinstance(resumed, Lease) and resumed.lender == "marketing"
    backend.submit(job(burst.gang_id, splits, checkpoints, device_class="gpu"))
    assert backend.wait(burst.gang_id, 300).state is GangState.SUCCEEDED
    assert f"resumed from step {stopped.step}" in backend.log_path(burst.gang_id).read_text()
    step, weights = final_weights(checkpoints)
    assert step == reference[0]
    assert_same(weights, reference[1])
    ledger.release(resumed.lease_id)

    actions = [(e.gang_id, e.action) for e in ledger.journal()]
    assert ("risk/month-end", "evict") in actions and ("risk/month-end", "preempted") in actions
    spans = [s for s in ledger.usage_spans(0) if s.gang_id == "risk/month-end"]
    assert [s.ended_by for s in spans] == ["preempted", "released"]
    assert all(s.borrowed == 2 and s.lost_device_s == 0 for s in spans)


def test_scenario_5_an_urgent_gang_preempts_the_long_run_which_waits_behind_it(
    splits: dict[str, str], tmp_path: Path
) -> None:
    cluster, ledger, backend = lab(tmp_path)
    checkpoints = (tmp_path / "ckpt").as_uri()
    long_run = request("research/two-weeks", "research", 0, "batch")
    assert isinstance(ledger.try_acquire(long_run, "operator", 600), Lease)
    backend.submit(job(long_run.gang_id, splits, checkpoints, step_delay=0.02, device_class="gpu"))
    wait_for_step(backend.log_path(long_run.gang_id), 45)

    urgent = request("research/replacement", "research", 1000, "urgent")
    trigger = LeaseTrigger(
        request=request_to_dict(urgent),
        ledger_path=str(ledger.path),
        cluster_file=str(cluster),
        holder="triggerer",
        ttl_s=600,
        deadline=1e12,
        state_dir=str(backend.state_dir),
    )
    first = trigger.poll()  # the ledger picks the victim; this poll asks it to stop
    assert first["status"] == "waiting"
    assert first["reason"].startswith("stopping research/two-weeks (checkpoint first)")
    assert "preempted by research/replacement (priority 1000)" in first["reason"]
    status = backend.wait(long_run.gang_id, 120)
    assert status.state is GangState.PREEMPTED and status.exit_codes == (75, 75)
    stopped = CheckpointManager(checkpoints).latest()
    assert stopped is not None and stopped.step >= 45
    second = trigger.poll()  # gives the stopped gang's devices back ...
    third = second if second["status"] == "granted" else trigger.poll()
    assert third["status"] == "granted", (second, third)  # ... and the urgent gang starts

    # The long run asks again and waits until the urgent gang is done.
    waits = ledger.try_acquire(long_run, "operator", 600)
    assert isinstance(waits, Refusal)
    held = ledger.lease_for(urgent.gang_id)
    assert held is not None
    ledger.release(held.lease_id)
    # granted again, it resumes from `stopped` as scenario 4's reclaimed gang does
    assert isinstance(ledger.try_acquire(long_run, "operator", 600), Lease)
    preempted = [s for s in ledger.usage_spans(0) if s.gang_id == long_run.gang_id]
    assert preempted[0].ended_by == "preempted" and preempted[0].lost_device_s == 0


def test_a_team_below_its_quota_reclaims_it_from_a_borrower_of_another_lenders_quota(
    splits: dict[str, str], tmp_path: Path
) -> None:
    """risk borrows marketing's idle GPUs; marketing then takes its own quota on the
    last free node, so risk's borrowed gang sits on research's. research (a class that
    does not preempt) asks for its quota: risk, above its own, gives it back in time."""
    _, ledger, backend = lab(tmp_path)
    checkpoints = (tmp_path / "ckpt").as_uri()
    assert isinstance(
        ledger.try_acquire(request("risk/own", "risk", 100, "normal"), "t", 600), Lease
    )
    burst = request("risk/month-end", "risk", 100, "normal")
    lease = ledger.try_acquire(burst, "operator", 600)
    assert isinstance(lease, Lease) and (lease.borrowed, lease.lender) == (2, "marketing")
    backend.submit(job(burst.gang_id, splits, checkpoints, step_delay=0.02, device_class="gpu"))
    wait_for_step(backend.log_path(burst.gang_id), 20)
    campaign = request("marketing/campaign", "marketing", 100, "normal")
    assert isinstance(ledger.try_acquire(campaign, "operator", 600), Lease)

    steady = request("research/steady", "research", 0, "batch")
    why = ledger.try_acquire(steady, "operator", 600)
    assert isinstance(why, Refusal)
    assert why.reason.startswith("stopping risk/month-end (checkpoint first)"), why.reason
    reclaim = "reclaimed for research/steady, within its team's quota: team risk uses 4 of its 2"
    assert reclaim in why.reason
    stop_for(ledger, backend, burst.gang_id)
    stopped = CheckpointManager(checkpoints).latest()
    assert stopped is not None and stopped.step >= 20  # checkpointed on notice
    granted = ledger.try_acquire(steady, "operator", 600)
    assert isinstance(granted, Lease) and granted.borrowed == 0
    assert ledger.lease_for("risk/own") is not None  # within risk's quota: untouched
