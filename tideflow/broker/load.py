"""Inference load sources: a trace file, a seeded synthetic diurnal generator, Prometheus;
and the serving side's latency signal, from Prometheus or a model.

Every load source answers the same question: the request rate per window over a
time range. A window without a usable value (missing from the trace, zero,
NaN, a failed scrape) is a *data gap* (``rate is None``), never "no load":
the broker must not hand the inference pool to training because a metric
went silent.

A latency source (``ServingSignal``) answers, per window already served: the
latency at the SLO's percentile (or the share of requests over the latency
target), from which the broker learns its per-GPU throughput
(``tideflow.broker.throughput``).
"""

from __future__ import annotations

import csv
import functools
import itertools
import json
import math
import random
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tideflow.config import ConfigError


class LoadSourceError(ConfigError):
    """Bad input to a load source, located (file and line, or URL) and explained: a
    setting (``TIDEFLOW_BROKER_LOAD``, a flag) the broker cannot use."""


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


def _usable(value: float, *, zero: bool = False) -> float | None:
    """The value, or None (a gap) when NaN, infinite, negative or (unless ``zero``) zero."""
    return value if math.isfinite(value) and (value > 0 or (zero and value == 0)) else None


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
        return _synthetic_draw(self, start_s)[0]

    def burst_at(self, start_s: float) -> bool:
        """Whether the window starting at ``start_s`` carries a burst: what no forecast
        from the past can know, told to the burst-blind bound (``simulate``)."""
        return _synthetic_draw(self, start_s)[1]

    def _draw(self, start_s: float) -> tuple[float | None, bool]:
        # One generator per window, seeded by (seed, window): any range gives the same values.
        rng = random.Random(hash((self.seed, int(start_s // self.window_s))))
        if rng.random() < self.outage_probability:
            return None, False
        hour = (start_s % self.day_s) / self.day_s * 24
        day = int(start_s // self.day_s) % 7
        daily = 1 + self.daily_amplitude * math.cos(2 * math.pi * (hour - self.peak_hour) / 24)
        weekly = self.weekend_factor if day >= 5 else 1.0
        rate = self.mean_rps * daily * weekly * (1 + rng.gauss(0, self.noise))
        burst = rng.random() < self.burst_probability
        if burst:
            rate *= self.burst_factor
        return max(rate, 0.0) or None, burst

    def samples(self, start_s: float, end_s: float) -> list[LoadSample]:
        step = self.window_s
        first = math.ceil(start_s / step) * step
        count = max(0, math.ceil((end_s - first) / step))
        return [LoadSample(first + i * step, self.rate_at(first + i * step)) for i in range(count)]


# The broker asks again for the same history every step; a window's draw is fixed by
# (load, start), so it is drawn once. Seeding a generator per window dominated a step.
@functools.lru_cache(maxsize=1 << 16)
def _synthetic_draw(load: SyntheticLoad, start_s: float) -> tuple[float | None, bool]:
    return load._draw(start_s)


MAX_STEPS = 11000  # steps Prometheus answers in one range query


class PrometheusLoad:
    """A Prometheus range query (``/api/v1/query_range``) giving requests/s.

    Steps the server returns no value for, NaN, zero, or a failed request are gaps.
    """

    def __init__(
        self,
        base_url: str,
        query: str,
        *,
        window_s: float = 60.0,
        timeout_s: float = 10.0,
        zero_is_value: bool = False,  # a latency signal's share over target may be 0
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.query = query
        self.window_s = window_s
        self.timeout_s = timeout_s
        self.zero_is_value = zero_is_value

    def samples(self, start_s: float, end_s: float) -> list[LoadSample]:
        step = self.window_s
        first = math.ceil(start_s / step) * step
        count = max(0, math.ceil((end_s - first) / step))
        grid = [first + i * step for i in range(count)]
        values: dict[int, float | None] = {}
        # Prometheus refuses a range of more than MAX_STEPS steps (web/api/v1/api.go,
        # queryRange): the broker's week of history at 60 s is more, so it is asked
        # in parts.
        for at in range(0, len(grid), MAX_STEPS):
            part = grid[at : at + MAX_STEPS]
            answered = self._range(part[0], part[-1])
            if answered is None:
                return [LoadSample(t, None) for t in grid]  # unreachable: gaps, never zeros
            values.update(answered)
        return [LoadSample(t, values.get(round(t))) for t in grid]

    def _range(self, start_s: float, end_s: float) -> dict[int, float | None] | None:
        """One range query's values by second; None when Prometheus cannot be reached or
        fails to execute the query (a gap). A query it refuses as bad (HTTP 400) is an
        error: it stays wrong until someone fixes it (web/api/v1/api.go, errorBadData)."""
        step = self.window_s
        params = urllib.parse.urlencode(
            {"query": self.query, "start": start_s, "end": end_s, "step": f"{step:g}s"}
        )
        url = f"{self.base_url}/api/v1/query_range?{params}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code != 400:
                # 422 is a query Prometheus could not execute now (too many samples, a
                # rollout's duplicate series), 5xx its own trouble: the metric is silent.
                return None
            try:
                body = json.loads(exc.read())
            except ValueError:
                body = {"error": f"HTTP {exc.code} {exc.reason}"}
        except (OSError, ValueError):
            return None
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
                values[round(float(stamp))] = _usable(float(text), zero=self.zero_is_value)
            except ValueError:
                values[round(float(stamp))] = None
        return values


@dataclass(frozen=True)
class ServedWindow:
    """A window inference served: its start, its request rate (None: a gap), its GPUs."""

    start_s: float
    rate: float | None
    gpus: int


class ServingSignal(Protocol):
    def signals(self, windows: Sequence[ServedWindow]) -> list[float | None]:
        """Per window, the serving side's latency signal (None: not measured)."""
        ...


class PrometheusSignal:
    """A Prometheus range query giving, per window, the latency at the SLO's percentile
    (e.g. ``histogram_quantile(0.99, sum by (le) (rate(..._bucket[10m])))``) or the
    share of requests over the latency target. A failed scrape is a gap."""

    def __init__(self, base_url: str, query: str, *, window_s: float) -> None:
        self.series = PrometheusLoad(base_url, query, window_s=window_s, zero_is_value=True)

    def signals(self, windows: Sequence[ServedWindow]) -> list[float | None]:
        if not windows:
            return []
        first, last = min(w.start_s for w in windows), max(w.start_s for w in windows)
        values = {
            round(s.start_s): s.rate
            for s in self.series.samples(first, last + self.series.window_s)
        }
        return [values.get(round(w.start_s)) for w in windows]


@dataclass(frozen=True)
class SyntheticLatency:
    """A model of the serving side, for tests and demos (no serving system runs here).

    Each GPU is a queue: its latency at the SLO's percentile grows as
    ``1 / (service_rate - per_gpu_rate)`` (an M/M/1 queue's sojourn time is
    exponential with that rate, so every percentile of it does), scaled so that it
    equals ``slo_s`` exactly at ``capacity_rps`` per GPU, the true throughput the
    broker should learn; above the service rate the queue overflows. Each window's
    latency carries seeded log-normal noise (``noise``, per window).
    """

    capacity_rps: float
    slo_s: float = 1.0
    spare: float = 0.25  # the service rate is this share above capacity_rps
    noise: float = 0.1
    seed: int = 0
    window_s: float = 600.0

    def latency(self, start_s: float, per_gpu_rps: float) -> float:
        service = self.capacity_rps * (1 + self.spare)
        queueing = self.capacity_rps * self.spare / max(service - per_gpu_rps, 1e-9)
        rng = random.Random(hash((self.seed, int(start_s // self.window_s), 1)))
        return self.slo_s * min(queueing, 100.0) * math.exp(rng.gauss(0, self.noise))

    def signals(self, windows: Sequence[ServedWindow]) -> list[float | None]:
        return [
            self.latency(w.start_s, w.rate / w.gpus) if w.rate and w.gpus > 0 else None
            for w in windows
        ]
