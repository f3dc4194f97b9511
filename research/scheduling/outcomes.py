"""What a teams replay reports: each gang's outcome, and per team the figures the
benchmark compares policies on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from research.scheduling.streams import Job


@dataclass
class JobOutcome:
    job: Job
    first_start: float | None = None
    finished: float | None = None
    waited_s: float = 0.0  # every span in the queue, requeues included
    held_device_s: float = 0.0
    borrowed_device_s: float = 0.0
    preemptions: int = 0  # stops the ledger asked for
    forced: int = 0  # of those, stopped at the grace deadline before a checkpoint
    lost_s: float = 0.0  # run time thrown away by forced stops
    overhead_s: float = 0.0  # restarts and checkpoint-on-signal saves
    runs: int = 0

    @property
    def first_wait_s(self) -> float:
        assert self.first_start is not None
        return self.first_start - self.job.arrival_s


@dataclass(frozen=True)
class TeamFigures:
    team: str
    jobs: int
    queue_mean_h: float  # arrival to first start
    queue_p95_h: float
    waited_mean_h: float  # all time queued, requeues after preemption included
    quota_use: float  # device-hours / (nominal x window)
    cluster_share: float  # device-hours / (cluster x window)
    own_device_h: float
    borrowed_device_h: float
    preemptions: int
    forced: int
    lost_device_h: float

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in vars(self).items()}


@dataclass
class Result:
    policy: str
    window_s: float
    devices: int
    outcomes: dict[str, JobOutcome]
    teams: dict[str, TeamFigures]
    cluster_use: float  # device-hours held within the window / (cluster x window)
    makespan_s: float
    decisions: int  # try_acquire calls

    def outcome(self, gang_id: str) -> JobOutcome:
        return self.outcomes[gang_id]
