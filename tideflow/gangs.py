"""Turn a gang training step into the scheduling and backend objects it needs.

Shared by the Airflow operator, its triggers and the CLI, so that all of them
derive the same gang id, request and job from the same step.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tideflow.backends.protocol import GangJob, WorkerSlot
from tideflow.inventory import detect_local, inventory_for
from tideflow.scheduling import GangRequest, Lease, LeaseLedger
from tideflow.steps.commands import resolve_command

LEASE_TTL_S = 60.0


def gang_id_for(dag_id: str, run_id: str, task_id: str) -> str:
    """Stable across Airflow retries of the same task in the same DAG run."""
    return f"{dag_id}/{run_id}/{task_id}"


def open_ledger(path: Path, cluster_file: str | None) -> LeaseLedger:
    path.parent.mkdir(parents=True, exist_ok=True)
    return LeaseLedger(path, inventory_for(cluster_file))


def request_to_dict(request: GangRequest) -> dict[str, Any]:
    return asdict(request)


def request_from_dict(data: dict[str, Any]) -> GangRequest:
    return GangRequest(**data)


def build_request(gang_id: str, team: str, config: dict[str, Any]) -> GangRequest:
    device = config["device"]
    workers = int(config["workers"])
    minimum = config.get("min_workers")
    return GangRequest(
        gang_id=gang_id,
        team=team,
        device_class=device["class"],
        model=device.get("model"),
        workers=workers,
        devices_per_worker=int(config["devices_per_worker"]),
        priority=int(config.get("priority", 0)),
        preemptible=bool(config.get("preemptible", True)),
        # elastic only when the minimum is below the size; equal means rigid
        min_workers=int(minimum) if minimum not in (None, "") and int(minimum) < workers else None,
    )


def machine_has(device_class: str) -> bool:
    """Whether this machine really has devices of the class (else they are emulated)."""
    if device_class == "cpu":
        return True
    local = detect_local()
    return any(node.device_class == device_class for node in local.nodes)


def checkpoint_env(checkpoint: dict[str, Any], uri: str) -> dict[str, str]:
    env = {"TIDEFLOW_CHECKPOINT_URI": uri, "TIDEFLOW_KEEP_LAST": str(checkpoint["keep_last"])}
    if checkpoint.get("every_steps"):
        env["TIDEFLOW_CHECKPOINT_EVERY_STEPS"] = str(checkpoint["every_steps"])
    if checkpoint.get("every_seconds"):
        env["TIDEFLOW_CHECKPOINT_EVERY_SECONDS"] = str(checkpoint["every_seconds"])
    best = checkpoint.get("keep_best")
    if best:
        env["TIDEFLOW_KEEP_BEST_METRIC"] = best["metric"]
        env["TIDEFLOW_KEEP_BEST_MODE"] = best["mode"]
    return env


def build_job(
    lease: Lease,
    *,
    command: list[str],
    env: dict[str, str],
    device_class: str,
    max_restarts: int,
    ledger_path: Path,
) -> GangJob:
    slots = tuple(WorkerSlot(p.rank, p.node, tuple(p.devices)) for p in lease.placements)
    return GangJob(
        gang_id=lease.gang_id,
        command=tuple(resolve_command(command)),
        env=env,
        slots=slots,
        device_class=device_class,
        emulated=not machine_has(device_class),
        max_restarts=max_restarts,
        lease_id=lease.lease_id,
        lease_db=str(ledger_path),
        lease_ttl_s=LEASE_TTL_S,
    )


def build_cluster_job(
    gang_id: str,
    team: str,
    config: dict[str, Any],
    *,
    command: list[str],
    env: dict[str, str],
    max_restarts: int,
) -> GangJob:
    """A gang for a cluster's gang scheduler: it places the workers, so no lease and no nodes.

    The command is kept as written (``python`` is the image's interpreter,
    not this process's).
    """
    per_worker = int(config["devices_per_worker"])
    device = config["device"]
    return GangJob(
        gang_id=gang_id,
        command=tuple(str(part) for part in command),
        env=env,
        slots=tuple(
            WorkerSlot(rank, "", tuple(range(per_worker))) for rank in range(int(config["workers"]))
        ),
        device_class=device["class"],
        emulated=False,
        max_restarts=max_restarts,
        team=team,
        model=device.get("model"),
        priority=int(config.get("priority", 0)),
    )


def holder_name() -> str:
    return f"{os.uname().nodename}:{os.getpid()}:{Path(sys.argv[0]).name}"
