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
  * still running at the deadline: kill it now (``kill_gang``: its supervisor
    kills every worker's process group, and the gang ends preempted) and give
    its devices back once none of its processes runs; the work since its last
    checkpoint is lost and accounted as such.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from tideflow.backends.protocol import Backend
from tideflow.checkpoint.recency import work_lost_at
from tideflow.scheduling import Lease, LeaseLedger
from tideflow.scheduling.ledger import Eviction


@dataclass(frozen=True)
class EvictionStep:
    gang_id: str
    action: str  # asked, stopped, forced, gone, or forcing (not seen dead yet)
    detail: str = ""


def kill_gang(backend: Backend, gang_id: str) -> bool:
    """Stop the gang now; whether none of its processes runs any more, which is when
    its devices may be granted again. A backend that cannot tell (its gangs are not
    processes of this machine) is trusted to stop it."""
    kill = getattr(backend, "kill", None)
    if kill is None:
        backend.cancel(gang_id)
        return True
    return bool(kill(gang_id))


def left_nothing(backend: Backend, gang_id: str) -> bool:
    """Whether nothing of a gang that ended still runs: on the local backend, the
    workers of a supervisor that died outlive it, and are killed here."""
    kill = getattr(backend, "kill", None)
    return kill is None or bool(kill(gang_id))


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
        if status is not None and not status.state.finished:
            if not eviction.signalled:
                backend.preempt(eviction.gang_id)
                ledger.mark_signalled(eviction.gang_id)
                steps.append(EvictionStep(eviction.gang_id, "asked", eviction.reason))
            elif clock() >= eviction.deadline:
                steps.append(_force(ledger, backend, eviction, lease, clock))
        elif left_nothing(backend, eviction.gang_id):
            ledger.release(lease.lease_id)
            steps.append(EvictionStep(eviction.gang_id, "stopped"))
        else:
            steps.append(EvictionStep(eviction.gang_id, "forcing", _NOT_DEAD))
    return steps


_NOT_DEAD = "some of its processes are not dead yet: its devices stay held"


def _force(
    ledger: LeaseLedger,
    backend: Backend,
    eviction: Eviction,
    lease: Lease,
    clock: Callable[[], float],
) -> EvictionStep:
    """Stop a gang still running past its grace. Its devices go back only once it is
    seen dead (a SIGTERM it ignores, or a process it left, must not share them with
    the next gang), and the work since its last checkpoint is accounted lost."""
    if not kill_gang(backend, eviction.gang_id):
        return EvictionStep(eviction.gang_id, "forcing", _NOT_DEAD)
    # the work since its last checkpoint, read from the store it was given (a
    # backend that cannot say: since its start, the safe direction); a supervisor
    # holding the lease has given it back already, accounted the same way
    store_of = getattr(backend, "checkpoint_store", None)
    store = store_of(eviction.gang_id) if store_of is not None else None
    lost = work_lost_at(clock(), lease.acquired_at, store)
    ledger.release(lease.lease_id, lost_s=max(lost, 1e-9))
    return EvictionStep(
        eviction.gang_id,
        "forced",
        f"still running {clock() - eviction.requested_at:.0f}s after it was asked "
        "to stop; killed, and its work since its last checkpoint is lost",
    )
