"""Carrying out the ledger's evictions on the local backend.

The ledger decides, inside its transaction, which gangs must stop so that a
gang with a better claim (its lender's quota, a preempting priority class, an
expired borrow) can start, and records each with a grace deadline. It cannot
signal processes, so whoever waits for devices carries the evictions out on
every poll (``enforce_evictions``), idempotently:

  * not yet asked: ask it to checkpoint and stop (the supervisor's SIGUSR1 ->
    SIGTERM to the workers -> commit -> exit 75, resumable);
  * stopped: give its devices back (the ledger journals it as preempted); its
    own operator sees the preemption, waits for devices again and resumes from
    that checkpoint;
  * still running at the deadline: stop it now and give its devices back; the
    work since its last checkpoint is lost and accounted as such.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from tideflow.backends.protocol import Backend
from tideflow.checkpoint.recency import work_lost_at
from tideflow.scheduling import LeaseLedger


@dataclass(frozen=True)
class EvictionStep:
    gang_id: str
    action: str  # asked, stopped, forced, gone
    detail: str = ""


def enforce_evictions(
    ledger: LeaseLedger,
    backend: Backend,
    *,
    clock: Callable[[], float] = time.time,
) -> list[EvictionStep]:
    steps = []
    for eviction in ledger.evictions():
        lease = ledger.lease_for(eviction.gang_id)
        if lease is None:
            steps.append(EvictionStep(eviction.gang_id, "gone"))
            continue
        status = backend.status(eviction.gang_id)
        if status is None or status.state.finished:
            ledger.release(lease.lease_id)
            steps.append(EvictionStep(eviction.gang_id, "stopped"))
        elif not eviction.signalled:
            backend.preempt(eviction.gang_id)
            ledger.mark_signalled(eviction.gang_id)
            steps.append(EvictionStep(eviction.gang_id, "asked", eviction.reason))
        elif clock() >= eviction.deadline:
            # the work since its last checkpoint, read from the store it was given (a
            # backend that cannot say: since its start, the safe direction)
            store_of = getattr(backend, "checkpoint_store", None)
            store = store_of(eviction.gang_id) if store_of is not None else None
            lost = work_lost_at(clock(), lease.acquired_at, store)
            backend.cancel(eviction.gang_id)
            ledger.release(lease.lease_id, lost_s=max(lost, 1e-9))
            steps.append(
                EvictionStep(
                    eviction.gang_id,
                    "forced",
                    f"still running {clock() - eviction.requested_at:.0f}s after it was asked "
                    "to stop; its work since its last checkpoint is lost",
                )
            )
    return steps
