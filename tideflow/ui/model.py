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
class TeamRow:
    """A team's quota on one device class (and model), its use now and this month."""

    team: str
    device: str  # "gpu", or "H100 gpu" for a per-model quota
    device_class: str
    nominal: int
    in_use: int
    borrowed: int  # of in_use, beyond its quota
    lent: int  # of its quota, held by other teams' gangs now
    # The month's device-hours and budget are per device class (usage is recorded per
    # class): the same on every row of one team's class.
    month_hours: float
    budget_hours: float | None


@dataclass(frozen=True)
class QueueRow:
    gang_id: str
    team: str
    priority_class: str | None
    priority: int
    devices: int
    device: str
    waited_s: float
    reason: str  # gang ids the viewer may not see are replaced (tideflow.ui.access)


@dataclass(frozen=True)
class JournalRow:
    at: str  # UTC
    gang_id: str
    team: str
    action: str  # evict (asked to stop), preempted (stopped after a checkpoint), forced
    reason: str


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
    teams: tuple[TeamRow, ...] = field(default=())
    teams_declared: bool = False  # the cluster file declares teams (else one shared pool)
    budget_month: str = ""  # the calendar month (UTC) of month_hours, "2026-11"
    queue: tuple[QueueRow, ...] = field(default=())
    preemptions: tuple[JournalRow, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
