"""The gangs of this machine as an operator sees them, and stopping one for good.

``tideflow gangs`` lists every gang the lease ledger or the local backend knows
(holding devices, waiting for them, or still running), with its holder, team,
age, devices and state, and cancels one. ``tideflow run`` stops the gangs it
holds when it is interrupted, so Ctrl-C never leaves workers running or a lease
held.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from tideflow.backends.local import LocalBackend
from tideflow.scheduling import LeaseLedger

STOP_WAIT_S = 30.0


@dataclass(frozen=True)
class GangRow:
    gang_id: str
    state: str  # the backend's state, or "waiting" for devices
    team: str
    holder: str
    devices: int
    age_s: float


def gang_rows(ledger: LeaseLedger, backend: LocalBackend) -> list[GangRow]:
    """Every gang holding devices, waiting for them, or running, oldest first."""
    now = time.time()
    rows: dict[str, GangRow] = {}
    for lease in ledger.leases():
        status = backend.status(lease.gang_id)
        rows[lease.gang_id] = GangRow(
            lease.gang_id,
            str(status.state) if status is not None else "leased",
            lease.team,
            lease.holder,
            sum(max(1, len(p.devices)) for p in lease.placements),
            now - lease.acquired_at,
        )
    for request, since in ledger.waiting():
        if request.gang_id not in rows:
            rows[request.gang_id] = GangRow(
                request.gang_id,
                "waiting",
                request.team,
                "",
                request.workers * request.devices_per_worker,
                now - since,
            )
    for gang_id, status in backend.statuses():
        if gang_id not in rows and not status.state.finished:
            job = backend.job(gang_id)
            rows[gang_id] = GangRow(
                gang_id,
                str(status.state),
                job.team if job is not None else "",
                "",
                job.workers if job is not None else 0,
                now - (status.started_at or now),
            )
    return sorted(rows.values(), key=lambda row: -row.age_s)


def stop_gang(gang_id: str, ledger: LeaseLedger, backend: LocalBackend) -> str:
    """Cancel the gang, wait for its workers to stop, free its lease and its queue place.

    The lease is freed only once none of the gang's processes runs: what its
    supervisor did not stop in time (or left, having died) is killed first.
    """
    status = backend.status(gang_id)
    if status is not None and not status.state.finished:
        backend.cancel(gang_id)
        with contextlib.suppress(TimeoutError):  # its supervisor kills what is left
            status = backend.wait(gang_id, STOP_WAIT_S)
    dead = backend.kill(gang_id)
    if status is not None and not status.state.finished:
        status = backend.status(gang_id)
    lease = ledger.lease_for(gang_id)
    if lease is not None and dead:
        ledger.release(lease.lease_id)
    ledger.forget(gang_id)
    state = "no process" if status is None else str(status.state)
    if not dead:
        return f"gang {gang_id}: {state}; some of its processes would not die: lease kept"
    return f"gang {gang_id}: {state}; lease {'released' if lease else 'none'}"


def stop_gangs_of(holder: str, ledger: LeaseLedger, backend: LocalBackend) -> list[str]:
    """Stop every gang whose lease ``holder`` took (this process, on an interrupt)."""
    return [
        stop_gang(lease.gang_id, ledger, backend)
        for lease in ledger.leases()
        if lease.holder == holder
    ]
