"""What a gang asks for, what it is granted, and why it may have to wait."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Literal

from tideflow.spec.teams import device_label

DeviceClass = Literal["cpu", "gpu", "npu"]


@dataclass(frozen=True)
class GangRequest:
    gang_id: str  # stable, e.g. "dag_id/run_id/task_id": one lease per gang
    team: str
    device_class: DeviceClass
    model: str | None  # None = any one model; a gang never mixes models
    workers: int
    devices_per_worker: int
    priority: int = 0  # higher goes first
    preemptible: bool = True
    # Elastic: the gang may start (and be resized) with as few as this many workers.
    min_workers: int | None = None
    priority_class: str | None = None  # the cluster file's class that gave ``priority``

    def __post_init__(self) -> None:
        if self.min_workers is not None and not 1 <= self.min_workers <= self.workers:
            raise ValueError(
                f"gang {self.gang_id}: min_workers {self.min_workers} must be within "
                f"1..{self.workers} (its workers)"
            )

    @property
    def elastic(self) -> bool:
        return self.min_workers is not None and self.min_workers < self.workers

    @property
    def devices(self) -> int:
        return self.workers * self.devices_per_worker

    def label(self) -> str:
        return device_label(self.device_class, self.model)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> GangRequest:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class WorkerPlacement:
    rank: int
    node: str
    devices: tuple[int, ...]  # device indices on that node


@dataclass(frozen=True)
class DeviceUsage:
    """Device-hours one team held on one device class over some window."""

    team: str
    device_class: str
    hours: float


@dataclass(frozen=True)
class Lease:
    lease_id: str
    gang_id: str
    holder: str
    team: str
    device_class: str
    model: str | None
    placements: tuple[WorkerPlacement, ...]
    priority: int
    preemptible: bool
    acquired_at: float
    expires_at: float
    min_workers: int | None = None  # the request's elastic minimum (None: rigid)
    borrowed: int = 0  # devices beyond its team's nominal quota (tideflow.scheduling.quota)
    lender: str | None = None  # whose quota it borrows ("" the shared pool; None: nothing)
    priority_class: str | None = None

    @property
    def devices(self) -> int:
        return sum(len(p.devices) for p in self.placements)

    @property
    def workers(self) -> int:
        return len(self.placements)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.node for p in self.placements))

    def placements_json(self) -> str:
        return json.dumps([asdict(p) for p in self.placements])

    @staticmethod
    def placements_from_json(text: str) -> tuple[WorkerPlacement, ...]:
        data: list[dict[str, Any]] = json.loads(text)
        return tuple(WorkerPlacement(p["rank"], p["node"], tuple(p["devices"])) for p in data)


@dataclass(frozen=True)
class Refusal:
    reason: str  # plain words: why not now, or why never
    never: bool  # True: can never fit this inventory, fail fast
