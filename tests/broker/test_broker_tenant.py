"""The broker as a tenant: when the cluster file declares a team ``inference``,
the broker's reservations count against its quota, the GPUs it lends are that
quota's idle devices which other teams borrow under the file's rules, and
growing back is the lender's reclaim through the ledger's evictions (the same
path a training team's reclaim takes), with the rule's grace.

The real-gang test runs a digits gang on declared GPUs emulated on the CPU (as
the local backend does for any missing device class); the others hold leases
only, with no processes to stop.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.checkpoints.test_runtime_distributed import (
    job,
    splits,
    wait_for_step,
)
from tideflow.backends import GangState
from tideflow.backends.local import LocalBackend
from tideflow.broker import Action
from tideflow.broker.actuator import Applied
from tideflow.broker.local import INFERENCE_PREFIX, LocalActuator
from tideflow.broker.policy import BrokerDecision
from tideflow.broker.service import BrokerSettings, open_local
from tideflow.checkpoint import CheckpointManager
from tideflow.inventory import load_cluster
from tideflow.scheduling import GangRequest, Lease, LeaseLedger, Refusal

__all__ = ["splits"]  # fixtures shared with the CPU gang tests

LAB = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: lab}
nodes:
  - {name: n, count: 3, cpu: 8, accelerators: {class: gpu, model: T4, count: 1}}
teams:
  - {name: inference, quota: [{device: gpu, nominal: 2}]}
  - {name: research, quota: [{device: gpu, nominal: 1}]}
borrowing:
  - {lender: inference, borrower: research, grace: 2m}
"""


def ledger_for(tmp_path: Path, text: str = LAB) -> LeaseLedger:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(text)
    return LeaseLedger(tmp_path / "leases.db", load_cluster(cluster))


def to(gpus: int) -> BrokerDecision:
    action = Action.GROW if gpus else Action.LEND
    return BrokerDecision(action, gpus, None, None, reason=f"test: inference to {gpus}")


@pytest.mark.processes
def test_lent_gpus_are_borrowed_under_the_rules_and_reclaimed_with_a_checkpoint(
    splits: dict[str, str], tmp_path: Path
) -> None:
    ledger = ledger_for(tmp_path)
    backend = LocalBackend(tmp_path / "gangs")
    actuator = LocalActuator(
        ledger,
        backend,
        node_gpus=1,
        grace_s=1,
        poll_s=0.2,
        checkpoint_store=backend.checkpoint_store,
    )
    assert actuator.tenant and actuator.capacity() == 2
    assert actuator.apply(to(0)).inference_gpus == 0  # the broker lends all of its quota

    # Research's 2-GPU gang: its own 1 and 1 borrowed of inference's idle quota.
    request = GangRequest("digits-train", "research", "gpu", None, 2, 1)
    lease = ledger.try_acquire(request, "operator", 600)
    assert isinstance(lease, Lease) and (lease.borrowed, lease.lender) == (1, "inference")
    checkpoints = (tmp_path / "ckpt").as_uri()
    backend.submit(job("digits-train", splits, checkpoints, step_delay=0.02, device_class="gpu"))
    wait_for_step(backend.log_path("digits-train"), 45)

    # Load arrives: one reservation takes the free GPU, the second is the lender's
    # reclaim. The ledger asks the borrowing gang to stop (not the actuator's own
    # grace of 1 s: the rule's 2 minutes), it checkpoints and exits resumable.
    applied = actuator.apply(to(2))
    assert isinstance(applied, Applied)  # the one result type of both actuators
    assert applied.complete and applied.inference_gpus == 2
    assert applied.preempted == ("digits-train",) and applied.forced == ()
    status = backend.status("digits-train")
    assert status is not None and status.state is GangState.PREEMPTED
    stopped = CheckpointManager(checkpoints).latest()
    assert stopped is not None and stopped.step >= 45
    evicted = [e for e in ledger.journal() if e.action == "evict"]
    assert [e.gang_id for e in evicted] == ["digits-train"]
    assert "reclaimed by its lender inference" in evicted[0].reason
    (span,) = [s for s in ledger.usage_spans(0) if s.gang_id == "digits-train"]
    assert (span.ended_by, span.borrowed, span.lost_device_s) == ("preempted", 1, 0.0)

    # While inference uses its quota, research cannot borrow it back.
    waiting = ledger.try_acquire(request, "operator", 600)
    assert isinstance(waiting, Refusal) and "inference 0" in waiting.reason

    # Load falls away: the quota is idle again and research borrows it back; its gang
    # resumes from the step it stopped at as a reclaimed borrower's does (tests/teams).
    assert actuator.apply(to(0)).inference_gpus == 0
    assert isinstance(ledger.try_acquire(request, "operator", 600), Lease)


def test_the_broker_takes_no_more_than_its_quota_nor_a_gang_within_its_own(
    tmp_path: Path,
) -> None:
    ledger = ledger_for(tmp_path)
    actuator = LocalActuator(ledger, None, node_gpus=1, poll_s=0.01)
    actuator.apply(to(0))
    own = GangRequest("own", "research", "gpu", None, 1, 1)
    assert isinstance(ledger.try_acquire(own, "operator", 600), Lease)
    applied = actuator.apply(to(3))  # the policy would take all three GPUs
    assert applied.inference_gpus == 2 and applied.preempted == ()
    assert "capped at inference's quota of 2" in applied.note
    assert "own" in {x.gang_id for x in ledger.leases()}
    assert [e for e in ledger.journal() if e.action == "evict"] == []


def test_a_reservation_that_cannot_be_made_does_not_hold_back_training(tmp_path: Path) -> None:
    """A borrowing gang that may not be stopped (not preemptible) keeps inference's
    GPU; the broker says why, and its unplaced reservation leaves the queue, so a
    training gang that fits starts rather than waiting behind it forever."""
    ledger = ledger_for(tmp_path)
    actuator = LocalActuator(ledger, None, node_gpus=1, poll_s=0.01)
    actuator.apply(to(0))
    pinned = GangRequest("pinned", "research", "gpu", None, 2, 1, preemptible=False)
    assert isinstance(ledger.try_acquire(pinned, "operator", 600), Lease)
    applied = actuator.apply(to(2))
    assert not applied.complete and applied.inference_gpus == 1 and applied.preempted == ()
    assert "the ledger:" in applied.note and "held by pinned" in applied.note
    assert all(not r.gang_id.startswith(INFERENCE_PREFIX) for r, _ in ledger.waiting())
    assert actuator.apply(to(1)).inference_gpus == 1
    # pinned ends; a research gang of one GPU starts on the freed devices at once
    ledger.release(next(x.lease_id for x in ledger.leases() if x.gang_id == "pinned"))
    small = GangRequest("small", "research", "gpu", None, 1, 1)
    assert isinstance(ledger.try_acquire(small, "operator", 600), Lease)


def test_forgetting_a_request_withdraws_the_evictions_nobody_carried_out(
    tmp_path: Path,
) -> None:
    """A waiter that gives up (the broker lends again before its reclaim was carried
    out) must not leave an eviction behind that would stop a gang for nothing."""
    ledger = ledger_for(tmp_path)
    borrower = GangRequest("borrower", "research", "gpu", None, 3, 1)
    assert isinstance(ledger.try_acquire(borrower, "operator", 600), Lease)
    reservation = GangRequest(f"{INFERENCE_PREFIX}0", "inference", "gpu", None, 1, 1, 10**6)
    refused = ledger.try_acquire(reservation, "broker", 600)
    assert isinstance(refused, Refusal) and "stopping borrower" in refused.reason
    assert [e.gang_id for e in ledger.evictions()] == ["borrower"]
    ledger.forget(reservation.gang_id)
    assert ledger.evictions() == []
    assert [x.gang_id for x in ledger.leases()] == ["borrower"]


def test_a_local_broker_that_is_a_tenant_moves_within_its_quota(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(LAB)
    settings = BrokerSettings(load="synthetic:12", per_gpu_rps=10.0, node_gpus=1)
    _, actuator, config, _ = open_local(
        settings, tmp_path / "leases.db", tmp_path / "broker.db", str(cluster)
    )
    assert actuator.tenant and (config.total_gpus, config.ceiling) == (3, 2)
    with pytest.raises(ValueError, match=r"team inference's gpu quota .* below the broker's"):
        open_local(
            BrokerSettings(
                load="synthetic:12", per_gpu_rps=10.0, node_gpus=1, min_inference_gpus=3
            ),
            tmp_path / "leases.db",
            tmp_path / "broker.db",
            str(cluster),
        )
