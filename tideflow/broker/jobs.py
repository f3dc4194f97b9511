"""Training job streams for the simulator: a seeded synthetic backlog or a CSV file."""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass
from pathlib import Path

from tideflow.broker.load import LoadSourceError

JOB_COLUMNS = ("submit_s", "gpus", "duration_s", "checkpoint_every_s", "priority")


@dataclass(frozen=True)
class JobSpec:
    job_id: str
    submit_s: float
    gpus: int
    work_s: float  # seconds of training the gang needs at full size
    checkpoint_every_s: float
    priority: int = 0
    min_gpus: int | None = None  # elastic: it may be shrunk to this many GPUs; None: rigid


def synthetic_jobs(
    *,
    seed: int,
    total_gpus: int,
    horizon_s: float,
    offered_fraction: float = 0.55,
    sizes: tuple[int, ...] = (8, 16, 32, 64),
    weights: tuple[float, ...] = (0.4, 0.3, 0.2, 0.1),
    hours: tuple[float, float] = (2.0, 12.0),
    checkpoint_every_s: float = 1800.0,
    submit_until_fraction: float = 0.85,
    elastic_fraction: float = 0.0,
    short_fraction: float = 0.0,
    short_hours: tuple[float, float] = (0.25, 1.5),
    short_gpus: int = 8,
) -> list[JobSpec]:
    """Poisson arrivals offering ``offered_fraction`` of the cluster's GPU-hours on average.

    Gangs of 8-64 GPUs running 2-12 hours, submitted over the first 85% of
    the horizon so that most can finish inside it. The same seed gives the same
    stream, whichever policy is being measured. ``elastic_fraction`` of the gangs
    of 16 GPUs or more are elastic down to half their size; which ones is drawn
    from a generator of its own, so the stream is otherwise the same one.
    ``short_fraction`` of the arrivals are short jobs instead (evaluations, sweeps):
    ``short_gpus`` GPUs for ``short_hours`` of work, drawn from a generator of their
    own; the arrival rate falls so that the offered GPU-hours stay the same.
    """
    if not 0 <= short_fraction < 1:
        raise ValueError(f"short_fraction must be within [0, 1) (got {short_fraction})")
    rng = random.Random(seed)
    elastic_rng = random.Random(f"elastic-{seed}")
    short_rng = random.Random(f"short-{seed}")
    short_jobs = (short_fraction, short_gpus, short_hours)
    per_hour = offered_fraction * total_gpus / _mean_gpu_hours(sizes, weights, hours, short_jobs)
    jobs: list[JobSpec] = []
    now, index = 0.0, 0
    until = horizon_s * submit_until_fraction
    while True:
        now += rng.expovariate(per_hour) * 3600
        if now >= until:
            return jobs
        gpus = rng.choices(sizes, weights)[0]
        work = rng.uniform(*hours) * 3600
        priority = 1 if rng.random() < 0.2 else 0
        if short_fraction and short_rng.random() < short_fraction:
            gpus, work = short_gpus, short_rng.uniform(*short_hours) * 3600
        elastic = elastic_rng.random() < elastic_fraction and gpus >= 16
        jobs.append(
            JobSpec(
                f"job-{index:04d}",
                round(now),
                gpus,
                work,
                checkpoint_every_s,
                priority,
                gpus // 2 if elastic else None,
            )
        )
        index += 1


def _mean_gpu_hours(
    sizes: tuple[int, ...],
    weights: tuple[float, ...],
    hours: tuple[float, float],
    short_jobs: tuple[float, int, tuple[float, float]],
) -> float:
    """The GPU-hours an arrival offers on average; ``short_jobs`` is the short jobs'
    (share of the arrivals, GPUs, hours range)."""
    short_fraction, short_gpus, short_hours = short_jobs
    mean_gpus = sum(s * w for s, w in zip(sizes, weights, strict=True)) / sum(weights)
    mean_hours = sum(hours) / 2
    return (1 - short_fraction) * mean_gpus * mean_hours + short_fraction * (
        short_gpus * sum(short_hours) / 2
    )


def load_jobs(path: Path | str) -> list[JobSpec]:
    """Jobs from a CSV with the columns submit_s,gpus,duration_s,checkpoint_every_s,priority
    (and optionally min_gpus, an elastic gang's minimum)."""
    path = Path(path)
    jobs = []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in JOB_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise LoadSourceError(
                f"{path}:1: missing column(s) {', '.join(missing)}; "
                f"expected {','.join(JOB_COLUMNS)}"
            )
        for line, row in enumerate(reader, start=2):
            try:
                job = JobSpec(
                    f"job-{line - 1:04d}",
                    float(row["submit_s"]),
                    int(row["gpus"]),
                    float(row["duration_s"]),
                    float(row["checkpoint_every_s"]),
                    int(row["priority"] or 0),
                    int(row["min_gpus"]) if (row.get("min_gpus") or "").strip() else None,
                )
            except (TypeError, ValueError):
                raise LoadSourceError(
                    f"{path}:{line}: {dict(row)} — submit_s, duration_s and "
                    "checkpoint_every_s are seconds, gpus, priority and min_gpus whole numbers"
                ) from None
            if job.gpus <= 0 or job.work_s <= 0 or job.checkpoint_every_s <= 0:
                raise LoadSourceError(
                    f"{path}:{line}: gpus, duration_s and checkpoint_every_s must be > 0"
                )
            if job.min_gpus is not None and not 1 <= job.min_gpus <= job.gpus:
                raise LoadSourceError(f"{path}:{line}: min_gpus must be within 1..gpus")
            jobs.append(job)
    return sorted(jobs, key=lambda j: (j.submit_s, j.job_id))
