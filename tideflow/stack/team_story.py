"""The demo's multi-team story on the local stack: the broker lends, a team borrows,
the broker reclaims.

The lab (``deploy/local/lab-cluster.yaml``) declares six emulated GPUs, team
``inference`` (the broker, a tenant with a quota of four) and team ``vision``
(two), and lets vision borrow inference's idle quota. The broker runs as the
``tideflow_broker`` DAG on a synthetic diurnal load whose day lasts a few
minutes. The story, each step through the real components:

  1. broker DAG runs until inference holds less than its quota (the trough);
  2. an elastic vision gang of 3 to 4 GPUs (digits, workers on emulated GPUs)
     asks the lease ledger: two of its own quota and what inference lends (all
     of it: the lab has no other idle GPU, so the next growth must reclaim
     it); it starts on
     the local backend (with its lease, renewed by its supervisor, as a gang
     step's is), and the story waits for its first checkpoint;
  3. broker DAG runs until the load climbs and the broker takes its GPU back:
     the ledger asks the borrowing gang to stop, it checkpoints and exits
     resumable (75) within the rule's grace.

The tideflow page then shows it: vision's borrowed device in the teams panel
while it runs, the eviction and the preemption in the journal, the gang's
reason in the queue when it asks again.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tideflow.backends.protocol import GangJob, WorkerSlot

if TYPE_CHECKING:
    from tideflow.backends.local import LocalBackend
    from tideflow.scheduling import GangRequest, Lease, LeaseLedger

LAB_CLUSTER = Path(__file__).resolve().parents[2] / "deploy" / "local" / "lab-cluster.yaml"
# a training gang of the digits pipeline (team vision): who may read that DAG sees it
GANG_ID = "digits/team-story/train"
BROKER_ENV = {
    "TIDEFLOW_CLUSTER_FILE": str(LAB_CLUSTER),
    # a diurnal load of 8 requests/s on average whose day lasts 3 minutes; one GPU
    # serves 4/s, so inference needs one or two GPUs at night and three or four at
    # the peak (the forecast's margin included)
    "TIDEFLOW_BROKER_LOAD": "synthetic:8@180",
    "TIDEFLOW_BROKER_PER_GPU_RPS": "4",
    "TIDEFLOW_BROKER_NODE_GPUS": "1",
    "TIDEFLOW_BROKER_GRACE_S": "60",
    "TIDEFLOW_BROKER_POLL_S": "1",
    # a broker run waits (deferred) for the load to ask for a change
    "TIDEFLOW_BROKER_SENSE_S": "150",
}


@dataclass(frozen=True)
class StoryResult:
    borrowed: int  # of the gang's devices, from inference's idle quota
    evicted: str  # the ledger's reason for stopping it ("" if it never was)
    checkpoint_step: int | None  # the step its checkpoint on notice holds
    broker_runs: int

    @property
    def told(self) -> bool:
        return bool(self.evicted) and self.checkpoint_step is not None


def _splits(root: Path) -> dict[str, str]:
    from tideflow.examples.digits import prepare
    from tideflow.steps import StepContext

    ctx = StepContext(
        pipeline="team-story",
        team="vision",
        step="prepare",
        dag_id="team-story",
        run_id="demo",
        try_number=1,
        artifact_root=root.as_uri(),
    )
    return prepare(ctx)


def _gang_job(home: Path, lease_id: str, workers: int, checkpoints: str) -> GangJob:
    data = _splits(home / "team-story" / "data")
    command = (
        sys.executable,
        "-m",
        "tideflow.examples.digits_train",
        "--train",
        data["train"],
        "--validation",
        data["validation"],
        "--epochs",
        "200",  # long enough to be running when the load climbs
        "--checkpoint-every",
        "10",
        "--step-delay",
        "0.05",
    )
    return GangJob(
        GANG_ID,
        command,
        {"TIDEFLOW_CHECKPOINT_URI": checkpoints, "TIDEFLOW_MIN_WORKERS": "3"},
        tuple(WorkerSlot(rank, "localhost", (rank,)) for rank in range(workers)),
        "gpu",
        True,
        0,
        lease_id=lease_id,
        lease_db=str(home / "leases.db"),
        lease_ttl_s=60.0,
        preempt_grace_s=30.0,
        team="vision",
    )


def run_team_story(
    home: Path,
    step_broker: Callable[[], str],
    *,
    timeout_s: float = 480.0,
    say: Callable[[str], None] = print,
) -> StoryResult:
    """Drive the story; ``step_broker`` runs one broker step (a DAG run) and returns
    its state. Stops the gang if the story does not complete within ``timeout_s``."""
    from tideflow.backends.local import LocalBackend
    from tideflow.broker.local import INFERENCE_PREFIX
    from tideflow.gangs import open_ledger
    from tideflow.scheduling import GangRequest

    ledger = open_ledger(home / "leases.db", str(LAB_CLUSTER))
    backend = LocalBackend(home / "gangs")
    checkpoints = (home / "team-story" / "checkpoints").as_uri()
    request = GangRequest(GANG_ID, "vision", "gpu", None, 4, 1, min_workers=3)
    deadline = time.monotonic() + timeout_s
    runs, started, borrowed = 0, False, 0

    def inference() -> int:
        return sum(x.devices for x in ledger.leases() if x.gang_id.startswith(INFERENCE_PREFIX))

    def evicted() -> str:
        return next(
            (e.reason for e in ledger.journal() if e.action == "evict" and e.gang_id == GANG_ID),
            "",
        )

    try:
        while time.monotonic() < deadline:
            state = step_broker()
            runs += 1
            say(f"  broker run {runs}: {state}; inference holds {inference()} GPU(s)")
            if not started:
                lease = _start_gang(ledger, backend, request, home, checkpoints, say)
                started, borrowed = lease is not None, lease.borrowed if lease else 0
                if started:
                    _wait_until_training(backend, checkpoints, deadline)
                continue
            reason = evicted()
            if reason:
                step = _after_eviction(ledger, backend, request, checkpoints, reason, say)
                return StoryResult(borrowed, reason, step, runs)
        return StoryResult(borrowed, evicted(), None, runs)
    finally:
        running = backend.status(GANG_ID)
        if running is not None and not running.state.finished:
            backend.cancel(GANG_ID)
        held = ledger.lease_for(GANG_ID)
        if held is not None and held.holder == "team-story":
            ledger.release(held.lease_id)


def _start_gang(  # noqa: PLR0917 (the story's parts, passed along)
    ledger: LeaseLedger,
    backend: LocalBackend,
    request: GangRequest,
    home: Path,
    checkpoints: str,
    say: Callable[[str], None],
) -> Lease | None:
    """vision's gang started on the lease the ledger grants it now; None when it must wait
    (it asks again after the next broker run)."""
    from tideflow.scheduling import Lease

    lease = ledger.try_acquire(request, "team-story", 3600)
    if not isinstance(lease, Lease):
        ledger.forget(request.gang_id)
        return None
    say(
        f"  vision's gang starts on {lease.devices} GPUs: "
        f"{lease.devices - lease.borrowed} of its own quota, {lease.borrowed} "
        f"borrowed from {lease.lender or 'nobody'}"
    )
    backend.submit(_gang_job(home, lease.lease_id, lease.workers, checkpoints))
    return lease


def _wait_until_training(backend: LocalBackend, checkpoints: str, deadline: float) -> None:
    """Until the gang has committed its first checkpoint (or ended): reclaimed while its
    workers still start, it would have nothing to save, and the story is the checkpoint
    a reclaimed gang writes on notice. The next broker run may reclaim at once."""
    from tideflow.checkpoint import CheckpointManager

    manager = CheckpointManager(checkpoints)
    while time.monotonic() < deadline and manager.latest(verify=False) is None:
        status = backend.status(GANG_ID)
        if status is not None and status.state.finished:
            return
        time.sleep(0.5)


def _after_eviction(  # noqa: PLR0917 (the story's parts, passed along)
    ledger: LeaseLedger,
    backend: LocalBackend,
    request: GangRequest,
    checkpoints: str,
    reason: str,
    say: Callable[[str], None],
) -> int | None:
    """How the stopped gang ended and what its operator would be granted asking again;
    the step of its newest checkpoint."""
    from tideflow.checkpoint import CheckpointManager
    from tideflow.scheduling import Lease

    status = backend.wait(GANG_ID, 120)
    latest = CheckpointManager(checkpoints).latest()
    say(f"  the ledger stopped vision's gang: {reason}")
    say(
        f"  it ended {status.state.value} (checkpoint at step "
        f"{latest.step if latest else '-'}); its operator would ask again:"
    )
    again = ledger.try_acquire(request, "team-story", 3600)
    if isinstance(again, Lease):  # the demo stops here: give them back
        say(f"    granted {again.devices} GPU(s) (what inference lends now)")
    else:
        say(f"    it waits: {again.reason}")
    return latest.step if latest else None
