"""Inference load sources: a trace file, a seeded synthetic diurnal generator, Prometheus.

Every source answers the same question: the request rate per window over a
time range. A window without a usable value (missing from the trace, zero,
NaN, a failed scrape) is a *data gap* (``rate is None``), never "no load":
the broker must not hand the inference pool to training because a metric
went silent.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import random
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class LoadSourceError(ValueError):
    """Bad input to a load source, located (file and line, or URL) and explained."""


@dataclass(frozen=True)
class LoadSample:
    start_s: float
    rate: float | None  # requests/s over the window; None = data gap


class LoadSource(Protocol):
    @property
    def window_s(self) -> float:
        """Seconds per window."""
        ...

    def samples(self, start_s: float, end_s: float) -> list[LoadSample]:
        """One sample per window whose start lies in [start_s, end_s), gaps included."""
        ...


def _usable(value: float) -> float | None:
    return value if math.isfinite(value) and value > 0 else None


class TraceLoad:
    """A CSV trace with columns ``start_s,rate_rps`` at a fixed window (e.g. 600 s)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise LoadSourceError(f"{self.path}: no such trace file")
        rates: dict[int, float | None] = {}
        with self.path.open(newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if header is None or [h.strip() for h in header[:2]] != ["start_s", "rate_rps"]:
                raise LoadSourceError(
                    f"{self.path}:1: header is {header!r}; expected the columns start_s,rate_rps"
                )
            for line, row in enumerate(reader, start=2):
                if not row or not "".join(row).strip():
                    continue
                try:
                    start, rate = float(row[0]), float(row[1])
                except (IndexError, ValueError):
                    raise LoadSourceError(
                        f"{self.path}:{line}: {row!r} is not two numbers "
                        "(start_s: seconds from the trace's start, rate_rps: requests/s)"
                    ) from None
                if start < 0 or int(start) != start:
                    raise LoadSourceError(
                        f"{self.path}:{line}: start_s {row[0]!r} must be a whole number >= 0"
                    )
                if int(start) in rates:
                    raise LoadSourceError(f"{self.path}:{line}: start_s {int(start)} repeated")
                rates[int(start)] = _usable(rate)
        if len(rates) < 2:
            raise LoadSourceError(f"{self.path}: needs at least two windows")
        starts = sorted(rates)
        steps = sorted({b - a for a, b in itertools.pairwise(starts)})
        self.window_s = float(steps[0])
        if any(step % steps[0] for step in steps):
            raise LoadSourceError(
                f"{self.path}: windows are not on one grid (gaps of {steps[:5]} s)"
            )
        self._rates = rates
        self.start_s = float(starts[0])
        self.end_s = float(starts[-1] + self.window_s)

    def samples(self, start_s: float, end_s: float) -> list[LoadSample]:
        step = int(self.window_s)
        first = max(int(self.start_s), int(math.ceil(start_s / step) * step))
        return [
            LoadSample(float(t), self._rates.get(t))  # a missing row is a gap too
            for t in range(first, int(min(end_s, self.end_s)), step)
        ]


@dataclass(frozen=True)
class SyntheticLoad:
    """Seeded diurnal load: daily and weekly cycle, noise, bursts and outages (gaps).

    For tests and demos; benchmarks use real traces. ``day_s`` compresses the
    day (a demo's day of a few minutes; its windows keep 144 to a day), and the
    broker scales its own horizons with it (``tideflow.broker.service``).
    """

    mean_rps: float = 1000.0
    daily_amplitude: float = 0.5  # peak/trough swing around the mean, as a fraction
    weekend_factor: float = 0.8
    noise: float = 0.05
    burst_probability: float = 0.01
    burst_factor: float = 1.6
    outage_probability: float = 0.005
    peak_hour: float = 14.0
    seed: int = 0
    window_s: float = 600.0
    day_s: float = 86400.0

    def rate_at(self, start_s: float) -> float | None:
        # One generator per window, seeded by (seed, window): any range gives the same values.
        rng = random.Random(hash((self.seed, int(start_s // self.window_s))))
        if rng.random() < self.outage_probability:
            return None
        hour = (start_s % self.day_s) / self.day_s * 24
        day = int(start_s // self.day_s) % 7
        daily = 1 + self.daily_amplitude * math.cos(2 * math.pi * (hour - self.peak_hour) / 24)
        weekly = self.weekend_factor if day >= 5 else 1.0
        rate = self.mean_rps * daily * weekly * (1 + rng.gauss(0, self.noise))
        if rng.random() < self.burst_probability:
            rate *= self.burst_factor
        return max(rate, 0.0) or None

    def samples(self, start_s: float, end_s: float) -> list[LoadSample]:
        step = self.window_s
        first = math.ceil(start_s / step) * step
        count = max(0, math.ceil((end_s - first) / step))
        return [LoadSample(first + i * step, self.rate_at(first + i * step)) for i in range(count)]


class PrometheusLoad:
    """A Prometheus range query (``/api/v1/query_range``) giving requests/s.

    Steps the server returns no value for, NaN, zero, or a failed request are gaps.
    """

    def __init__(
        self, base_url: str, query: str, *, window_s: float = 60.0, timeout_s: float = 10.0
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.query = query
        self.window_s = window_s
        self.timeout_s = timeout_s

    def samples(self, start_s: float, end_s: float) -> list[LoadSample]:
        step = self.window_s
        first = math.ceil(start_s / step) * step
        count = max(0, math.ceil((end_s - first) / step))
        grid = [first + i * step for i in range(count)]
        if not grid:
            return []
        params = urllib.parse.urlencode(
            {"query": self.query, "start": grid[0], "end": grid[-1], "step": f"{step:g}s"}
        )
        url = f"{self.base_url}/api/v1/query_range?{params}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as response:
                body = json.loads(response.read())
        except (OSError, ValueError):
            return [LoadSample(t, None) for t in grid]  # unreachable: all gaps, never zeros
        if body.get("status") != "success":
            raise LoadSourceError(f"{url}: Prometheus answered {body.get('error', body)!r}")
        result = body.get("data", {}).get("result", [])
        if len(result) > 1:
            raise LoadSourceError(
                f"{url}: the query returned {len(result)} series; it must return one "
                "(wrap it in sum(...))"
            )
        values: dict[int, float | None] = {}
        for stamp, text in result[0]["values"] if result else []:
            try:
                values[round(float(stamp))] = _usable(float(text))
            except ValueError:
                values[round(float(stamp))] = None
        return [LoadSample(t, values.get(round(t))) for t in grid]
