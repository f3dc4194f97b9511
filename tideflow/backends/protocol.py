"""The contract every gang backend meets: local processes today, Kubernetes later.

A backend is addressed by a stable ``gang_id`` (``dag/run/task``): ``submit`` is
idempotent for a gang that is still running, and ``reattach`` finds a gang
again after the Airflow worker that started it went away. Airflow retries
tasks and may run a trigger twice, so "start it once" must hold at this level.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Protocol


class GangState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"  # stopped on request after a committed checkpoint; resumable
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self not in (GangState.PENDING, GangState.RUNNING)


@dataclass(frozen=True)
class WorkerSlot:
    """Where one rank runs: a node and the device indices leased to it there."""

    rank: int
    node: str
    devices: tuple[int, ...]


@dataclass(frozen=True)
class GangJob:
    gang_id: str
    command: tuple[str, ...]
    env: dict[str, str]
    slots: tuple[WorkerSlot, ...]
    device_class: str
    emulated: bool
    max_restarts: int
    lease_id: str | None = None
    lease_db: str | None = None
    lease_ttl_s: float = 60.0
    preempt_grace_s: float = 120.0
    # Used by cluster backends (queue, priority class, node selector); the local one ignores them.
    team: str = "default"
    model: str | None = None
    priority: int = 0
    # The cluster file's priority class (its value is ``priority``): on a cluster the gang
    # names the WorkloadPriorityClass / PriorityClass ``tideflow compile`` made of it.
    priority_class: str | None = None
    # Labels for the cluster object and its pods besides its gang and team (pipeline, step, run).
    labels: dict[str, str] = field(default_factory=dict)
    # The workers' image on a cluster (None: the platform's); the local backend runs the
    # command on this machine.
    image: str | None = None
    # What each worker asks for besides its devices: pod requests (memory also the limit)
    # on a cluster; recorded in the job locally, where workers are not confined.
    cpu: str | None = None
    memory: str | None = None
    # The step's context files a cluster's pods get (name -> JSON text: context.json,
    # args.json); the local backend's workers get them through the environment instead.
    step_files: dict[str, str] = field(default_factory=dict)

    @property
    def workers(self) -> int:
        return len(self.slots)

    @property
    def devices_held(self) -> int:
        """The devices its workers hold (a worker without any holds its CPU slot)."""
        return sum(max(1, len(slot.devices)) for slot in self.slots)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> GangJob:
        data = json.loads(text)
        data["command"] = tuple(data["command"])
        data["slots"] = tuple(
            WorkerSlot(s["rank"], s["node"], tuple(s["devices"])) for s in data["slots"]
        )
        return cls(**data)


@dataclass(frozen=True)
class GangStatus:
    gang_id: str
    state: GangState
    restarts: int = 0
    message: str = ""
    exit_codes: tuple[int | None, ...] = ()
    started_at: float | None = None
    finished_at: float | None = None
    events: tuple[str, ...] = field(default=())
    # Devices held x seconds, over every attempt (restarts included): the
    # basis of GPU-hours accounting per team, run and step.
    device_seconds: float = 0.0
    # When the running attempt started (None: none runs): the status of a supervisor
    # that died before it could end the attempt counts that attempt's device time up
    # to when it is read (LocalBackend.status).
    attempt_started_at: float | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> GangStatus:
        data: dict[str, Any] = json.loads(text)
        data["state"] = GangState(data["state"])
        data["exit_codes"] = tuple(data.get("exit_codes", ()))
        data["events"] = tuple(data.get("events", ()))
        return cls(**data)


class Backend(Protocol):
    def submit(self, job: GangJob) -> GangStatus:
        """Start the gang, or return the status of the copy already running."""

    def status(self, gang_id: str) -> GangStatus | None:
        """Current status, or None if this backend never saw the gang."""

    def cancel(self, gang_id: str) -> None:
        """Stop every worker now; the gang ends CANCELLED."""

    def preempt(self, gang_id: str) -> None:
        """Ask the workers to checkpoint and exit; the gang ends PREEMPTED."""

    def reattach(self, gang_id: str) -> GangStatus | None:
        """Find a gang started by an earlier process (None if unknown or finished)."""
