"""A gang that ignores SIGTERM is killed, whole, before its devices are granted again.

Every path that stops a gang (a lender's reclaim, a preempting priority class, the
broker, a cancel from a timeout or ``tideflow gangs cancel``) must kill every process
of the gang, its workers' whole process groups included, and see them dead before
the ledger may grant its devices to another lease; the stopped gang's state, team
and accounting must say what happened. And a gang whose supervisor was killed
reports the device time its lease was charged, not nothing.

Real processes: the local supervisor, a training script that handles SIGTERM itself
(tests/stubborn_worker.py) with a data-loader process that ignores it, and the
SQLite ledger. The GPUs are declared and emulated on the CPU.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gangs.test_interrupts import alive
from tideflow.backends import GangState
from tideflow.backends.local import LocalBackend
from tideflow.broker import Forecast, PolicyConfig, Snapshot, decide
from tideflow.broker.local import LocalActuator
from tideflow.compile.gang_plan import gang_plan_from_json
from tideflow.gangs import build_job, enforce_evictions, resolve_gang
from tideflow.gangs.control import gang_rows, stop_gang
from tideflow.inventory import Inventory, Node, load_cluster
from tideflow.scheduling import GangRequest, Lease, LeaseLedger, Refusal

pytestmark = pytest.mark.processes

WORKER = str(Path(__file__).parents[1] / "stubborn_worker.py")
START_S = 90.0  # a gang's start on two busy cores

LAB = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: lab}
nodes:
  - {name: l4, count: 2, cpu: 8, accelerators: {class: gpu, model: L4, count: 4}}
priority_classes:
  - {name: urgent, value: 1000, preempts: true}
  - {name: normal, value: 0}
teams:
  - {name: research, quota: [{device: gpu, nominal: 4}], default_priority_class: normal}
  - {name: batch, quota: [{device: gpu, nominal: 2}], default_priority_class: normal}
  - {name: vision, quota: [{device: gpu, nominal: 2}], default_priority_class: normal}
borrowing:
  - {lender: research, borrower: batch, grace: 3s}
"""


def lab(tmp_path: Path) -> tuple[LeaseLedger, LocalBackend]:
    cluster = tmp_path / "lab.yaml"
    cluster.write_text(LAB)
    ledger = LeaseLedger(tmp_path / "leases.db", load_cluster(cluster))
    return ledger, LocalBackend(tmp_path / "gangs")


def start_gang(
    ledger: LeaseLedger,
    backend: LocalBackend,
    tmp_path: Path,
    *,
    pipeline: str,
    team: str,
    workers: int = 2,
    devices_per_worker: int = 2,
    on_term: str = "keep-training",
) -> tuple[Lease, Path]:
    """The stubborn script as a gang step, leased and started as the operator does
    (its supervisor holds the lease); the directory its processes report to."""
    out = tmp_path / pipeline
    out.mkdir()
    plan = gang_plan_from_json(
        {
            "entrypoint": ["python", WORKER],
            "workers": workers,
            "devices_per_worker": devices_per_worker,
            "device": {"class": "gpu", "model": None},
            "env": {"STUBBORN_DIR": str(out), "STUBBORN_ON_TERM": on_term},
            "max_restarts": 0,
        }
    )
    gang = resolve_gang(
        plan,
        pipeline=pipeline,
        team=team,
        run_id="r1",
        step="train",
        artifact_root=tmp_path.as_uri(),
        allowed_roots=[tmp_path.as_uri()],
        classes=ledger.inventory,
    )
    lease = ledger.try_acquire(gang.request(), "operator", 600)
    assert isinstance(lease, Lease), lease
    assert gang.command is not None
    job = build_job(gang, lease, command=list(gang.command), extra_env={}, ledger_path=ledger.path)
    backend.submit(job)
    return lease, out


def processes(out: Path, workers: int) -> list[int]:
    """Every worker's pid and its loader's, once all have started and taken a step."""
    deadline = time.monotonic() + START_S
    files = [out / f"pids-{rank}" for rank in range(workers)]
    while not all(f.exists() for f in files) or last_step(out, workers) == 0.0:
        assert time.monotonic() < deadline, "the gang never started"
        time.sleep(0.2)
    return [int(pid) for f in files for pid in f.read_text().split()]


def last_step(out: Path, workers: int) -> float:
    """When the gang's last step was taken (0: none yet)."""
    steps = [out / f"step-{rank}" for rank in range(workers)]
    return max((float(s.read_text().split()[1]) for s in steps if s.exists()), default=0.0)


@contextlib.contextmanager
def stopped_afterwards(backend: LocalBackend, out: Path) -> Iterator[None]:
    """Whatever the test's outcome, nothing it started is left running."""
    try:
        yield
    finally:
        for pids in out.glob("pids-*"):
            for pid in map(int, pids.read_text().split()):
                if alive(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        for directory in backend.state_dir.glob("*/supervisor.pid"):
            pid = int(directory.read_text())
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def wait_for_log(backend: LocalBackend, gang_id: str, text: str, count: int) -> None:
    deadline = time.monotonic() + 30
    while backend.log_path(gang_id).read_text().count(text) < count:
        assert time.monotonic() < deadline, f"never logged {count} x {text!r}"
        time.sleep(0.1)


def placed(lease: Lease) -> set[tuple[str, int]]:
    return {(p.node, device) for p in lease.placements for device in p.devices}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["reclaim", "preemption"])
def test_a_gang_that_ignores_sigterm_is_killed_before_its_devices_are_granted_again(
    tmp_path: Path, how: str
) -> None:
    ledger, backend = lab(tmp_path)
    assert ledger.teams is not None
    ledger.teams.preemption_grace_s = 3.0
    # The cluster is full but for the gang that will be stopped: vision's and batch's
    # own quota are held (leases only).
    for team in ("vision", "batch"):
        own = GangRequest(f"{team}/own", team, "gpu", None, 1, 2)
        assert isinstance(ledger.try_acquire(own, "t", 600), Lease)
    if how == "reclaim":  # batch borrows research's quota; research asks for it back
        victim, out = start_gang(ledger, backend, tmp_path, pipeline="burst", team="batch")
        asker = GangRequest("research/r1/train", "research", "gpu", None, 2, 2)
    else:  # research's own long run, preempted by its urgent gang
        victim, out = start_gang(ledger, backend, tmp_path, pipeline="long", team="research")
        asker = GangRequest(
            "urgent/r1/train", "research", "gpu", None, 2, 2, 1000, priority_class="urgent"
        )
    with stopped_afterwards(backend, out):
        pids = processes(out, 2)
        refusal = ledger.try_acquire(asker, "operator", 600)
        assert isinstance(refusal, Refusal) and f"stopping {victim.gang_id}" in refusal.reason
        assert [s.action for s in enforce_evictions(ledger, backend)] == ["asked"]
        wait_for_log(backend, victim.gang_id, "SIGTERM received; finishing the epoch", 2)
        (eviction,) = ledger.evictions()
        (row,) = [r for r in gang_rows(ledger, backend) if r.gang_id == victim.gang_id]
        assert (row.team, row.holder, row.devices) == (victim.team, "operator", 4)
        while (steps := [s.action for s in enforce_evictions(ledger, backend)]) == []:
            # the grace: it keeps its devices, and trains on
            assert isinstance(ledger.try_acquire(asker, "operator", 600), Refusal)
            time.sleep(0.2)
        assert steps == ["forced"] and time.time() >= eviction.deadline
        assert last_step(out, 2) > eviction.requested_at + 1.0  # it trained on after SIGTERM
        left = [pid for pid in pids if alive(pid)]
        assert not left, f"{len(left)} of the gang's {len(pids)} processes still run"
        granted = ledger.try_acquire(asker, "operator", 600)
        assert isinstance(granted, Lease), granted
        assert placed(granted) == placed(victim)  # the same devices, now free

        status = backend.status(victim.gang_id)
        assert status is not None and status.state is GangState.PREEMPTED, status
        assert "forced" in status.message
        assert victim.gang_id not in [r.gang_id for r in gang_rows(ledger, backend)]
        (span,) = [s for s in ledger.usage_spans(0) if s.gang_id == victim.gang_id]
        assert span.ended_by == "forced" and span.team == victim.team
        assert span.ended_at >= last_step(out, 2)  # charged for as long as it ran
        # no checkpoint: everything it did is lost, and nothing more
        assert span.lost_device_s == pytest.approx(4 * (span.ended_at - span.started_at), abs=1)


CONFIG = PolicyConfig(
    total_gpus=2, per_gpu_rps=10.0, node_gpus=1, headroom=0.0, min_inference_gpus=0, cooldown_s=0
)


@pytest.mark.timeout(240)
def test_the_broker_kills_a_gang_that_ignores_sigterm_before_it_reserves_its_gpus(
    tmp_path: Path,
) -> None:
    nodes = (Node("n0", 8, "gpu", "L4", 1), Node("n1", 8, "gpu", "L4", 1))
    ledger = LeaseLedger(tmp_path / "leases.db", Inventory("lab", nodes, declared=True))
    backend = LocalBackend(tmp_path / "gangs")
    actuator = LocalActuator(ledger, backend, node_gpus=1, grace_s=2.0, poll_s=0.2)
    lease, out = start_gang(
        ledger, backend, tmp_path, pipeline="digits", team="vision", devices_per_worker=1
    )
    with stopped_afterwards(backend, out):
        pids = processes(out, 2)
        snapshot = Snapshot(
            now_s=1000.0,
            inference_gpus=actuator.inference_gpus(),
            measured_rps=10.0,
            forecast=Forecast(10.0, 10.0, 10.0, "test"),
            idle_training_gpus=actuator.idle_training_gpus(),
            gangs=actuator.gangs(),
        )
        applied = actuator.apply(decide(snapshot, CONFIG))
        assert applied.forced == (lease.gang_id,) and applied.complete
        left = [pid for pid in pids if alive(pid)]
        assert not left, f"{len(left)} of the gang's {len(pids)} processes still run"
        status = backend.status(lease.gang_id)
        assert status is not None and status.state is GangState.PREEMPTED, status
        (span,) = [s for s in ledger.usage_spans(0) if s.gang_id == lease.gang_id]
        assert span.ended_by == "forced" and span.ended_at >= last_step(out, 2)


@pytest.mark.timeout(240)
def test_cancelling_a_gang_kills_the_processes_its_workers_leave_behind(tmp_path: Path) -> None:
    """``tideflow gangs cancel``, Ctrl-C and a step's timeout stop a gang this way: a
    worker that exits on SIGTERM must not leave its data loader on the devices."""
    ledger, backend = lab(tmp_path)
    lease, out = start_gang(
        ledger, backend, tmp_path, pipeline="tidy", team="batch", on_term="exit"
    )
    with stopped_afterwards(backend, out):
        pids = processes(out, 2)
        said = stop_gang(lease.gang_id, ledger, backend)
        assert said.startswith(f"gang {lease.gang_id}: cancelled;"), said
        left = [pid for pid in pids if alive(pid)]
        assert not left, f"{len(left)} of the gang's {len(pids)} processes still run"
        assert ledger.leases() == []


@pytest.mark.timeout(240)
def test_a_gang_whose_supervisor_was_killed_reports_the_device_time_it_was_charged(
    tmp_path: Path,
) -> None:
    ledger, backend = lab(tmp_path)
    lease, out = start_gang(ledger, backend, tmp_path, pipeline="orphan", team="batch")
    with stopped_afterwards(backend, out):
        pids = processes(out, 2)
        time.sleep(2.0)  # it trains a while
        supervisor = int((backend.gang_dir(lease.gang_id) / "supervisor.pid").read_text())
        os.kill(supervisor, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (status := backend.status(lease.gang_id)) is None or not status.state.finished:
            assert time.monotonic() < deadline, status
            time.sleep(0.1)
        assert status.state is GangState.FAILED and "supervisor" in status.message
        assert status.device_seconds > 4 * 2.0, status.device_seconds
        # Its workers outlived it: they are found and killed from what it recorded,
        # before its operator gives its lease back.
        assert backend.kill(lease.gang_id)
        assert not [pid for pid in pids if alive(pid)]
        status = backend.status(lease.gang_id)
        assert status is not None and status.state is GangState.FAILED
        ledger.release(lease.lease_id)
        (span,) = [s for s in ledger.usage_spans(0) if s.gang_id == lease.gang_id]
        assert status.started_at is not None
        # its devices, from its start (its lease is a little older) until they were freed
        charged_s = span.devices * (span.ended_at - status.started_at)
        assert status.device_seconds == pytest.approx(charged_s, abs=4 * 0.5)
