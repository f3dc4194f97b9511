"""The broker on the local backend: inference reservations in the lease ledger, and a
digits gang reclaimed with checkpoint-before-evict that resumes where it stopped.

The GPUs are declared (two one-GPU nodes); on a machine without GPUs the gang's
workers run emulated on the CPU, as the local backend does for any missing
device class.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.checkpoints.test_checkpoints_api import wait_for_checkpoint
from tests.checkpoints.test_runtime_distributed import (
    job,
    splits,
    wait_for_step,
)
from tests.fakes import WindowedLoad
from tideflow.backends import GangState
from tideflow.backends.local import LocalBackend
from tideflow.broker import Action, Forecast, PolicyConfig, Snapshot, decide
from tideflow.broker.journal import DecisionJournal
from tideflow.broker.local import INFERENCE_PREFIX, LocalActuator
from tideflow.broker.service import rebalance_once
from tideflow.checkpoint import CheckpointManager
from tideflow.inventory import Inventory, Node
from tideflow.scheduling import GangRequest, Lease, LeaseLedger, Refusal

__all__ = ["splits"]  # fixtures shared with the CPU gang tests

CONFIG = PolicyConfig(
    total_gpus=2, per_gpu_rps=10.0, node_gpus=1, headroom=0.0, min_inference_gpus=0, cooldown_s=0
)


def lab(tmp_path: Path) -> LeaseLedger:
    nodes = (Node("n0", 8, "gpu", "T4", 1), Node("n1", 8, "gpu", "T4", 1))
    return LeaseLedger(tmp_path / "leases.db", Inventory("lab", nodes, declared=True))


def lab_with_gangs(tmp_path: Path) -> tuple[LeaseLedger, LocalBackend, LocalActuator]:
    """The lab's ledger, a local gang backend, and an actuator that reads gangs' checkpoints."""
    ledger = lab(tmp_path)
    backend = LocalBackend(tmp_path / "gangs")
    actuator = LocalActuator(
        ledger,
        backend,
        node_gpus=1,
        grace_s=120,
        poll_s=0.2,
        checkpoint_store=backend.checkpoint_store,
    )
    return ledger, backend, actuator


def load_now(actuator: LocalActuator, now: float, rps: float) -> Snapshot:
    return Snapshot(
        now_s=now,
        inference_gpus=actuator.inference_gpus(),
        measured_rps=rps,
        forecast=Forecast(rps, rps, rps, "test"),
        idle_training_gpus=actuator.idle_training_gpus(),
        gangs=actuator.gangs(),
    )


@pytest.mark.processes
def test_a_reclaimed_gang_checkpoints_waits_resumes_and_is_forced_past_a_grace(
    splits: dict[str, str], tmp_path: Path
) -> None:
    """Reclaimed with a grace, the gang checkpoints on notice and waits; lent its GPU
    back, it resumes where it stopped (bitwise equal resumes: tests/checkpoints); reclaimed
    again with no grace, it is forced, and the work since its newest checkpoint is
    accounted lost."""
    ledger, backend, actuator = lab_with_gangs(tmp_path)
    request = GangRequest("digits-train", "vision", "gpu", None, 2, 1)
    checkpoints = (tmp_path / "ckpt").as_uri()

    lease = ledger.try_acquire(request, "operator", 600)
    assert isinstance(lease, Lease)
    backend.submit(job("digits-train", splits, checkpoints, step_delay=0.02, device_class="gpu"))
    wait_for_step(backend.log_path("digits-train"), 45)
    # The policy sees the work at risk from the gang's newest committed checkpoint,
    # read from its store, not from the lease's start.
    (view,) = actuator.gangs()
    commits = {m.created_at for m in CheckpointManager(checkpoints).committed()}
    assert view.last_checkpoint_s > lease.acquired_at and view.last_checkpoint_s in commits

    # Inference load arrives: it needs one GPU, and only the gang holds GPUs.
    peak = decide(load_now(actuator, 1000.0, 10.0), CONFIG)
    assert peak.action is Action.GROW and [r.gang_id for r in peak.reclaims] == ["digits-train"]
    applied = actuator.apply(peak)
    assert applied.complete and applied.preempted == ("digits-train",) and applied.forced == ()
    status = backend.status("digits-train")
    assert status is not None and status.state is GangState.PREEMPTED  # exit 75, resumable
    stopped = CheckpointManager(checkpoints).latest()
    assert stopped is not None and stopped.step >= 45  # checkpointed on notice, nothing lost
    assert [x.gang_id for x in ledger.leases()] == [f"{INFERENCE_PREFIX}0"]
    assert isinstance(ledger.try_acquire(request, "operator", 600), Refusal)  # waits
    # Accounted and journaled as a preemption, not as a gang that let its lease go.
    (span,) = [x for x in ledger.usage_spans(0) if x.gang_id == "digits-train"]
    assert (span.ended_by, span.lost_device_s) == ("preempted", 0.0)
    actions = [e.action for e in ledger.journal() if e.gang_id == "digits-train"]
    assert actions[-2:] == ["evict", "preempted"]
    assert actuator.training_work(0, ledger.clock()).stopped_gpus == 2

    # Load falls away: the node is lent back and the gang resumes where it stopped.
    trough = decide(load_now(actuator, 2000.0, 0.0), CONFIG)
    assert trough.action is Action.LEND
    assert actuator.apply(trough).inference_gpus == 0
    again = ledger.try_acquire(request, "operator", 600)
    assert isinstance(again, Lease)
    backend.submit(job("digits-train", splits, checkpoints, step_delay=0.02, device_class="gpu"))
    newest = wait_for_checkpoint(checkpoints, stopped.step + 1)  # a periodic one
    assert f"resumed from step {stopped.step}" in backend.log_path("digits-train").read_text()
    wait_for_step(backend.log_path("digits-train"), newest + 3)  # work past it

    # The load is back, and this time there is no grace: the gang is forced at once.
    forced = replace_grace(actuator, 0.0).apply(decide(load_now(actuator, 3000.0, 10.0), CONFIG))
    assert forced.forced == ("digits-train",) and forced.complete
    first, last = [x for x in ledger.usage_spans(0) if x.gang_id == "digits-train"]
    held_s = last.ended_at - again.acquired_at
    # The work since its newest checkpoint is lost, read from the store it was given.
    committed = CheckpointManager(checkpoints).latest()
    assert committed is not None and committed.created_at > again.acquired_at
    since = last.ended_at - committed.created_at
    assert last.ended_by == "forced" and last.lost_device_s == pytest.approx(2 * since, abs=0.1)
    assert 0 < last.lost_device_s < 2 * held_s
    work = actuator.training_work(0, ledger.clock())
    assert work.stopped_gpus == 4 and work.recorded_lost_gpu_s == last.lost_device_s
    trained = 2 * (first.ended_at - first.started_at) + 2 * held_s
    assert work.trained_gpu_s == pytest.approx(trained)
    assert work.lost_gpu_s(stop_cost_s=100) == pytest.approx(last.lost_device_s + 400)


def replace_grace(actuator: LocalActuator, grace_s: float) -> LocalActuator:
    return LocalActuator(
        actuator.ledger,
        actuator.backend,
        node_gpus=actuator.node_gpus,
        grace_s=grace_s,
        poll_s=actuator.poll_s,
        checkpoint_store=actuator.checkpoint_store,
    )


@pytest.mark.processes
def test_an_elastic_gang_is_shrunk_not_stopped_and_goes_on_with_fewer_workers(
    splits: dict[str, str], tmp_path: Path
) -> None:
    """The broker takes one of an elastic gang's two GPUs; the gang checkpoints and
    its next lease (what its operator asks for again) has the one GPU left."""
    ledger, backend, actuator = lab_with_gangs(tmp_path)
    request = GangRequest("flex", "vision", "gpu", None, 2, 1, min_workers=1)
    checkpoints = (tmp_path / "ckpt").as_uri()
    env = {"TIDEFLOW_CHECKPOINT_URI": checkpoints, "TIDEFLOW_MIN_WORKERS": "1"}

    def start(lease: Lease, **kw: Any) -> None:
        base = job("flex", splits, checkpoints, device_class="gpu", workers=lease.workers, **kw)
        backend.submit(replace(base, env=env))

    lease = ledger.try_acquire(request, "operator", 600)
    assert isinstance(lease, Lease) and lease.workers == 2
    start(lease, step_delay=0.02)
    wait_for_step(backend.log_path("flex"), 30)
    (view,) = actuator.gangs()
    assert view.gpus == 2 and view.min_gpus == 1

    peak = decide(load_now(actuator, 1000.0, 10.0), CONFIG)
    (reclaim,) = peak.reclaims
    assert peak.action is Action.GROW and (reclaim.gang_id, reclaim.evicted) == ("flex", False)
    applied = actuator.apply(peak)
    assert applied.complete and applied.preempted == ("flex",) and applied.forced == ()
    stopped = CheckpointManager(checkpoints).latest()
    assert stopped is not None and stopped.meta["world_size"] == 2

    # Its operator asks again: the ledger grants the one GPU inference left.
    smaller = ledger.try_acquire(request, "operator", 600)
    assert isinstance(smaller, Lease) and smaller.workers == 1
    start(smaller)
    assert backend.wait("flex", 300).state is GangState.SUCCEEDED
    log = backend.log_path("flex").read_text()
    assert f"resumed from step {stopped.step} (restart 0) on 1 worker(s), was 2" in log
    accuracy = float(re.findall(r'"val_accuracy": ([0-9.]+)', log)[-1])
    assert accuracy >= 0.93, log[-2000:]  # the run trained on as one worker
    final = CheckpointManager(checkpoints).latest()
    assert final is not None and final.meta["world_size"] == 1 and final.step > stopped.step
    assert actuator.inference_gpus() == 1


def test_a_broker_step_records_its_decision_and_reason(tmp_path: Path) -> None:
    ledger = lab(tmp_path)
    actuator = LocalActuator(ledger, None, node_gpus=1, grace_s=1)
    journal = DecisionJournal(tmp_path / "broker.db")
    load = WindowedLoad.series([12.0] * 12)  # two hours at 12 rps: needs 2 GPUs at 10 rps each
    decision, applied = rebalance_once(load, actuator, CONFIG, journal, now_s=12 * 600.0)
    assert decision.action is Action.GROW and applied is not None and applied.complete
    assert actuator.inference_gpus() == 2
    (entry,) = journal.since(0)
    assert entry.action == "grow" and entry.inference_gpus == 2 and entry.measured_rps == 12.0
    assert entry.reason == decision.reason and "grew 2 of 2" in entry.applied


@pytest.mark.parametrize("gap", [None, 0.0])
def test_no_lending_on_a_silent_metric(tmp_path: Path, gap: float | None) -> None:
    ledger = lab(tmp_path)
    actuator = LocalActuator(ledger, None, node_gpus=1)
    journal = DecisionJournal(tmp_path / "broker.db")
    rebalance_once(WindowedLoad.series([12.0] * 12), actuator, CONFIG, journal, now_s=12 * 600.0)
    silent = WindowedLoad.series([12.0] * 12 + [gap])  # type: ignore[list-item]
    decision, _ = rebalance_once(silent, actuator, CONFIG, journal, now_s=13 * 600.0)
    assert decision.action is Action.HOLD and actuator.inference_gpus() == 2
    assert decision.needed_now is None  # the silent window is a gap, not zero load
    assert decision.wanted == 2  # the forecast still covers the last real level
