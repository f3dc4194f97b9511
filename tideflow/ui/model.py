"""Rows of the tideflow page, as plain data (also served as JSON)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tideflow.ui.timeline import BrokerPoint


@dataclass(frozen=True)
class DagRunRow:
    run_id: str
    state: str
    started: str | None
    ended: str | None
    airflow_url: str
    mlflow_url: str | None = None
    mlflow_status: str | None = None


@dataclass(frozen=True)
class PipelineRow:
    dag_id: str
    team: str
    paused: bool
    runs: tuple[DagRunRow, ...]


@dataclass(frozen=True)
class ChampionRow:
    model: str
    version: str
    url: str | None
    dag_id: str | None
    dag_run_id: str | None
    checkpoint: str | None
    metrics: dict[str, str]
    previous_version: str | None
    versions: int


@dataclass(frozen=True)
class UsageRow:
    team: str
    device_class: str
    hours: float


@dataclass(frozen=True)
class LeaseRow:
    gang_id: str
    team: str
    purpose: str  # inference (broker reservation), training, spare (evaluation)
    device_class: str
    devices: int
    priority: int
    held_s: float


@dataclass(frozen=True)
class Overview:
    generated_at: str
    pipelines: tuple[PipelineRow, ...]
    champions: tuple[ChampionRow, ...]
    usage: tuple[UsageRow, ...]
    usage_window_days: int
    mlflow_url: str | None
    problems: tuple[str, ...] = field(default=())
    broker: tuple[BrokerPoint, ...] = field(default=())
    broker_window: tuple[float, float] | None = None
    leases: tuple[LeaseRow, ...] = field(default=())
    broker_shown: bool = True  # False: the caller may not see the broker (tideflow.ui.access)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
