"""A gang still running when its eviction's grace ends is stopped, and the work it
loses is the time since its newest checkpoint, read from the store it was given, not
its whole lease (``tideflow.gangs.evictions``).

A real ledger and the real local backend; the gang is a plain Python worker that
ignores the request to stop, as a hung training loop does.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tideflow.backends import GangJob, GangState, WorkerSlot
from tideflow.backends.local import LocalBackend
from tideflow.checkpoint import CHECKPOINT_URI_ENV, CheckpointManager
from tideflow.gangs.evictions import enforce_evictions
from tideflow.inventory import Inventory, Node
from tideflow.scheduling import GangRequest, Lease, LeaseLedger

pytestmark = pytest.mark.processes

# It says it is ready once it ignores the signals: a gang seen running may not have
# got that far yet on a busy machine, and would die of the first SIGTERM.
HUNG = (
    "import os, pathlib, signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "signal.signal(signal.SIGUSR1, signal.SIG_IGN)\n"
    "pathlib.Path(os.environ['HUNG_READY']).touch()\n"
    "time.sleep(120)\n"
)


def test_a_forced_stop_loses_the_work_since_the_newest_checkpoint(tmp_path: Path) -> None:
    nodes = (Node("n0", 8, "gpu", "T4", 2),)
    ledger = LeaseLedger(tmp_path / "leases.db", Inventory("lab", nodes, declared=True))
    backend = LocalBackend(tmp_path / "gangs")
    lease = ledger.try_acquire(GangRequest("hung", "default", "gpu", None, 1, 2), "op", 600)
    assert isinstance(lease, Lease)
    store = (tmp_path / "ckpt").as_uri()
    ready = tmp_path / "ready"
    time.sleep(1.0)  # the gang has run a while before its checkpoint
    checkpoint = CheckpointManager(store).save(10, {"model": b"weights"})
    backend.submit(
        GangJob(
            "hung",
            (sys.executable, "-c", HUNG),
            {CHECKPOINT_URI_ENV: store, "HUNG_READY": str(ready)},
            (WorkerSlot(0, "n0", (0, 1)),),
            "gpu",
            True,
            0,
            preempt_grace_s=30.0,
        )
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not ready.exists():
        time.sleep(0.1)
    status = backend.status("hung")
    assert status is not None and status.state is GangState.RUNNING
    assert ledger.evict("hung", "urgent", "test: preempted", grace_s=0.5)
    steps = enforce_evictions(ledger, backend)
    assert [s.action for s in steps] == ["asked"]
    time.sleep(1.0)  # past the grace, still running
    steps = enforce_evictions(ledger, backend)
    assert [s.action for s in steps] == ["forced"]
    (span,) = ledger.usage_spans(0)
    assert span.ended_by == "forced"
    since_checkpoint = span.ended_at - checkpoint.created_at
    assert span.lost_device_s == pytest.approx(2 * since_checkpoint, abs=0.2)
    assert span.lost_device_s < 2 * (span.ended_at - lease.acquired_at) - 1.0
    backend.wait("hung", 30)
