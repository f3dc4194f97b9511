"""A gang on this machine: its lease ledger, its workers' command and the local backend's job."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import NotRequired, TypedDict

from tideflow.backends.protocol import GangJob, WorkerSlot
from tideflow.gangs.resolved import ResolvedGang
from tideflow.inventory import detect_local, inventory_for
from tideflow.scheduling import GangRequest, Lease, LeaseLedger
from tideflow.scheduling.model import DeviceClass
from tideflow.steps.commands import resolve_command
from tideflow.steps.context import CONTEXT_ENV, OUTPUTS_ENV, StepContext
from tideflow.steps.entrypoints import ARGS_ENV

LEASE_TTL_S = 60.0


def open_ledger(path: Path, cluster_file: str | None) -> LeaseLedger:
    path.parent.mkdir(parents=True, exist_ok=True)
    return LeaseLedger(path, inventory_for(cluster_file))


class GangRequestJson(TypedDict):
    """A ``GangRequest`` as a trigger carries it (JSON, across the triggerer); the keys
    ``GangRequest`` has defaults for may be left out."""

    gang_id: str
    team: str
    device_class: DeviceClass
    model: str | None
    workers: int
    devices_per_worker: int
    priority: NotRequired[int]
    preemptible: NotRequired[bool]
    min_workers: NotRequired[int | None]
    priority_class: NotRequired[str | None]


def request_to_dict(request: GangRequest) -> GangRequestJson:
    return GangRequestJson(
        gang_id=request.gang_id,
        team=request.team,
        device_class=request.device_class,
        model=request.model,
        workers=request.workers,
        devices_per_worker=request.devices_per_worker,
        priority=request.priority,
        preemptible=request.preemptible,
        min_workers=request.min_workers,
        priority_class=request.priority_class,
    )


def request_from_dict(data: GangRequestJson) -> GangRequest:
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
        env=gang.local_env(extra_env),
        slots=slots,
        device_class=gang.device_class,
        emulated=not machine_has(gang.device_class),
        max_restarts=gang.max_restarts,
        team=gang.team,  # what `tideflow gangs` shows of a gang whose lease is gone
        lease_id=lease.lease_id,
        lease_db=str(ledger_path),
        lease_ttl_s=LEASE_TTL_S,
        cpu=gang.cpu,
        memory=gang.memory,
    )


# Each rank's outputs file: the supervisor puts the rank in its place (worker_env).
RANK_OUTPUTS = "outputs-rank-{rank}.json"


def local_command(
    gang: ResolvedGang, ctx: StepContext, directory: Path
) -> tuple[list[str], dict[str, str]]:
    """The workers' command line, and the step-context variables for their environment.

    Writes the step's context and args into ``directory``. Every worker gets
    ``$TIDEFLOW_STEP_CONTEXT``, ``$TIDEFLOW_STEP_ARGS`` and ``$TIDEFLOW_STEP_OUTPUTS``
    (its own file, ``outputs-rank-N.json``), as a data-prep step's process does; a
    ``module:function`` entry point is called through ``tideflow.steps.runner`` with
    the same files, and a command gets its args appended as options too.
    """
    directory.mkdir(parents=True, exist_ok=True)
    context, args = directory / "context.json", directory / "args.json"
    context.write_text(ctx.to_json(), encoding="utf-8")
    args.write_text(json.dumps(gang.args, default=str), encoding="utf-8")
    outputs = directory / RANK_OUTPUTS
    env = {CONTEXT_ENV: str(context), ARGS_ENV: str(args), OUTPUTS_ENV: str(outputs)}
    if gang.command is not None:
        return [str(part) for part in gang.command], env
    command = ["python", "-m", "tideflow.steps.runner", str(gang.entrypoint)]
    return [*command, str(context), str(args), str(outputs)], env


def holder_name() -> str:
    return f"{os.uname().nodename}:{os.getpid()}:{Path(sys.argv[0]).name}"
