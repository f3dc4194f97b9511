"""The teams' scheduling scenarios: the users' bank cluster and seeded streams of gangs.

``bank_spec`` is the cluster file the benchmark replays (three teams, quotas,
borrowing, a preempting class); ``static_quotas`` derives the no-borrowing,
no-preemption one. The streams (``month_end_stream``, ``urgent_stream``) are
seeded, so the same stream replays under both.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tideflow.inventory import ClusterSpec

HOUR = 3600.0
DAY = 24 * HOUR


@dataclass(frozen=True)
class Job:
    """One gang of a stream: what it asks for and how much work it carries."""

    gang_id: str
    team: str
    arrival_s: float
    workers: int
    devices_per_worker: int
    work_s: float  # run time it needs on its devices, without stops
    priority_class: str | None = None  # None: its team's default class
    checkpoint_every_s: float = HOUR  # periodic checkpoints, in its own run time
    save_s: float | None = 120.0  # checkpoint-on-signal time; None: periodic only
    restart_s: float = 60.0  # reloading its checkpoint after a (re)start
    deadline_s: float | None = None  # when it must have finished (reported, not enforced)

    @property
    def devices(self) -> int:
        return self.workers * self.devices_per_worker


# -- cluster specs ------------------------------------------------------------------------
def bank_spec(**scheduling: Any) -> ClusterSpec:
    """The users' bank: 100 GPUs (10 nodes of 10 H100) split risk 40, marketing 30,
    research 30; risk may borrow marketing's and research's idle share.
    ``scheduling`` overrides the file's ``scheduling:`` section (reserve_after, ...)."""
    return ClusterSpec.model_validate(
        {
            "apiVersion": "tideflow/v1",
            "kind": "Cluster",
            "metadata": {"name": "bank"},
            "nodes": [
                {
                    "name": "gpu",
                    "count": 10,
                    "cpu": 32,
                    "accelerators": {"class": "gpu", "model": "H100", "count": 10},
                }
            ],
            "priority_classes": [
                {"name": "urgent", "value": 1000, "preempts": True},
                {"name": "normal", "value": 100},
                {"name": "batch", "value": 0},
            ],
            "teams": [
                {
                    "name": "risk",
                    "quota": [{"device": "gpu", "nominal": 40}],
                    "default_priority_class": "normal",
                },
                {
                    "name": "marketing",
                    "quota": [{"device": "gpu", "nominal": 30}],
                    "default_priority_class": "normal",
                },
                {
                    "name": "research",
                    "quota": [{"device": "gpu", "nominal": 30}],
                    "default_priority_class": "batch",
                },
            ],
            "borrowing": [
                {
                    "lender": "marketing",
                    "borrower": "risk",
                    "max_borrowable_ratio": 0.8,
                    "grace": "10m",
                },
                {
                    "lender": "research",
                    "borrower": "risk",
                    "max_borrowable_ratio": 0.5,
                    "min_priority_class": "normal",
                },
            ],
            "scheduling": scheduling,
        }
    )


def static_quotas(spec: ClusterSpec) -> ClusterSpec:
    """The same teams and quotas with nothing lent and no class that preempts."""
    classes = tuple(c.model_copy(update={"preempts": False}) for c in spec.priority_classes)
    return spec.model_copy(update={"borrowing": (), "priority_classes": classes})


# -- streams -------------------------------------------------------------------------------
# (workers, devices per worker) of the gangs a team submits, on 10-GPU nodes.
_SHAPES = ((1, 2), (1, 5), (1, 10), (2, 10))


def _poisson_stream(
    rng: random.Random,
    team: str,
    *,
    offered: Sequence[tuple[float, float, float]],  # (from_s, to_s, devices busy on average)
    median_h: float,
    prefix: str,
    priority_class: str | None = None,
) -> list[Job]:
    """Gangs whose device-time adds up to ``offered`` devices busy over each span."""
    mean_devices = statistics.fmean(w * d for w, d in _SHAPES)
    sigma = 0.8
    mean_s = median_h * HOUR * math.exp(sigma**2 / 2)  # lognormal mean from its median
    jobs: list[Job] = []
    for start, end, busy in offered:
        rate = busy / (mean_devices * mean_s)  # gangs per second
        t = start
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= end:
                break
            workers, per = rng.choice(_SHAPES)
            work = min(48 * HOUR, median_h * HOUR * math.exp(rng.gauss(0, sigma)))
            jobs.append(
                Job(
                    f"{prefix}{team}-{len(jobs):04d}",
                    team,
                    t,
                    workers,
                    per,
                    work,
                    priority_class,
                    checkpoint_every_s=rng.choice((1800.0, 3600.0)),
                    save_s=rng.uniform(30, 180),
                )
            )
    return jobs


def month_end_stream(
    seed: int,
    *,
    days: float = 30,
    burst_days: float = 5,
    risk_load: float = 0.7,
    risk_burst: float = 1.7,
    marketing_load: float = 0.2,
    research_load: float = 0.8,
) -> list[Job]:
    """Scenario 4: risk steady at ``risk_load`` of its 40 GPUs, then ``risk_burst``
    times its quota over the last ``burst_days``; marketing at ``marketing_load``
    of its 30; research steady at ``research_load`` of its 30."""
    rng = random.Random(seed)
    end, burst = days * DAY, (days - burst_days) * DAY
    jobs = [
        *_poisson_stream(
            rng,
            "risk",
            offered=((0, burst, risk_load * 40), (burst, end, risk_burst * 40)),
            median_h=5,
            prefix="",
        ),
        *_poisson_stream(
            rng, "marketing", offered=((0, end, marketing_load * 30),), median_h=5, prefix=""
        ),
        *_poisson_stream(
            rng, "research", offered=((0, end, research_load * 30),), median_h=8, prefix=""
        ),
    ]
    return sorted(jobs, key=lambda j: j.arrival_s)


def urgent_stream(
    seed: int,
    *,
    days: float = 6,
    urgent_at_s: float = 3 * DAY,
    urgent_work_s: float = 16 * HOUR,
    long_save_s: float | None = 120.0,
) -> list[Job]:
    """Scenario 5: risk's two-week 32-GPU run (hourly checkpoints) holds its GPUs when
    an urgent 32-GPU replacement model arrives that must finish within 24 hours; the
    other teams busy with their own steady streams over the first ``days`` (after that
    the long run finishes alone)."""
    rng = random.Random(seed)
    end = days * DAY
    long_run = Job(
        "risk-long-run",
        "risk",
        0.0,
        4,
        8,
        14 * DAY,
        "normal",
        checkpoint_every_s=HOUR,
        save_s=long_save_s,
        restart_s=300.0,
    )
    urgent = Job(
        "risk-urgent",
        "risk",
        urgent_at_s,
        4,
        8,
        urgent_work_s,
        "urgent",
        checkpoint_every_s=HOUR,
        restart_s=300.0,
        deadline_s=urgent_at_s + 24 * HOUR,
    )
    others = [
        *_poisson_stream(rng, "risk", offered=((60.0, end, 6),), median_h=3, prefix="s5-"),
        *_poisson_stream(rng, "marketing", offered=((0, end, 20),), median_h=4, prefix="s5-"),
        *_poisson_stream(rng, "research", offered=((0, end, 24),), median_h=6, prefix="s5-"),
    ]
    return sorted([long_run, urgent, *others], key=lambda j: j.arrival_s)


# -- the replay ----------------------------------------------------------------------------
