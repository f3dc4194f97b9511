"""A gang on this machine: its lease ledger and the local backend's job."""

from __future__ import annotations

import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tideflow.backends.protocol import GangJob, WorkerSlot
from tideflow.gangs.resolved import ResolvedGang
from tideflow.inventory import detect_local, inventory_for
from tideflow.scheduling import GangRequest, Lease, LeaseLedger
from tideflow.steps.commands import resolve_command

LEASE_TTL_S = 60.0


def open_ledger(path: Path, cluster_file: str | None) -> LeaseLedger:
    path.parent.mkdir(parents=True, exist_ok=True)
    return LeaseLedger(path, inventory_for(cluster_file))


def request_to_dict(request: GangRequest) -> dict[str, Any]:
    return asdict(request)


def request_from_dict(data: dict[str, Any]) -> GangRequest:
    return GangRequest(**data)


def machine_has(device_class: str) -> bool:
    """Whether this machine really has devices of the class (else they are emulated)."""
    if device_class == "cpu":
        return True
    local = detect_local()
    return any(node.device_class == device_class for node in local.nodes)


def build_job(
    gang: ResolvedGang,
    lease: Lease,
    *,
    command: list[str],
    extra_env: dict[str, str],
    ledger_path: Path,
) -> GangJob:
    """The local backend's job: the gang on the devices its lease placed it on."""
    slots = tuple(WorkerSlot(p.rank, p.node, tuple(p.devices)) for p in lease.placements)
    return GangJob(
        gang_id=lease.gang_id,
        command=tuple(resolve_command(command)),
        env={**gang.env, **extra_env},
        slots=slots,
        device_class=gang.device_class,
        emulated=not machine_has(gang.device_class),
        max_restarts=gang.max_restarts,
        lease_id=lease.lease_id,
        lease_db=str(ledger_path),
        lease_ttl_s=LEASE_TTL_S,
    )


def holder_name() -> str:
    return f"{os.uname().nodename}:{os.getpid()}:{Path(sys.argv[0]).name}"
