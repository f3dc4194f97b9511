"""Load forecast from history only: the recent level, how far load has jumped before, and
the seasonal shape (same time yesterday / last week) times the recent trend.

The forecaster never sees the future: it gets the samples before ``now`` and
bounds the windows in [now, now + horizon). Its upper bound is the recent
level times an upper quantile of the jumps observed over the same horizon in
the past days (learned, not configured), or the seasonal estimate when that is
higher (a daily peak that is due). Outage windows are cleaned out first
(``clean_outages``), so a silent metric neither drags the level down nor
teaches the forecaster that load can drop to zero.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tideflow.broker.load import LoadSample

DAY_S = 86400.0
WEEK_S = 7 * DAY_S


@dataclass(frozen=True)
class Forecast:
    point: float | None  # expected rate in the next window
    peak: float | None  # highest expected rate over the horizon
    upper: float | None  # what capacity should cover over the horizon (quantile bound)
    basis: str  # how it was made: level, level+seasonal, none


def clean_outages(
    samples: Sequence[LoadSample], *, fraction: float = 0.1, lookback: int = 144
) -> list[LoadSample]:
    """Mark as gaps the windows far below the trailing median (a metric outage, not load).

    Causal: each window is judged against the windows before it only.
    """
    cleaned: list[LoadSample] = []
    recent: list[float] = []
    for sample in samples:
        rate = sample.rate
        if rate is not None and len(recent) >= 6 and rate < fraction * statistics.median(recent):
            rate = None
        cleaned.append(LoadSample(sample.start_s, rate))
        if rate is not None:
            recent.append(rate)
            if len(recent) > lookback:
                recent.pop(0)
    return cleaned


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class LoadForecaster:
    def __init__(
        self,
        window_s: float,
        *,
        quantile: float = 0.995,
        recent_windows: int = 3,
        jump_windows: int = 7 * 144,
        trend_windows: int = 6,
    ) -> None:
        self.window_s = window_s
        self.quantile = quantile
        self.recent_windows = recent_windows
        self.jump_windows = jump_windows
        self.trend_windows = trend_windows

    def _slot(self, t: float) -> int:
        return round(t / self.window_s)

    def _seasonal(self, rates: dict[int, float], slot: int, now_slot: int) -> float | None:
        day, week = self._slot(DAY_S), self._slot(WEEK_S)
        seen = [rates[slot - lag] for lag in (day, week) if slot - lag in rates]
        if not seen:
            return None
        pairs = [
            (rates[s], rates[s - day])
            for s in range(now_slot - self.trend_windows, now_slot)
            if s in rates and s - day in rates
        ]
        trend = 1.0
        if len(pairs) >= max(2, self.trend_windows // 2):
            trend = min(2.0, max(0.5, sum(a for a, _ in pairs) / sum(b for _, b in pairs)))
        return sum(seen) / len(seen) * trend

    def _jump(self, rates: dict[int, float], now_slot: int, ahead: int, quantile: float) -> float:
        """Upper quantile of max(next `ahead` windows) / recent level, over past windows."""
        ratios = []
        for slot in range(now_slot - self.jump_windows - ahead, now_slot - ahead):
            # The same base as the bound uses: the highest of the recent windows, so a
            # dip does not count as a jump when load comes back to its level.
            seen = [rates[s] for s in range(slot - self.recent_windows + 1, slot + 1) if s in rates]
            base = max(seen) if slot in rates else None
            nxt = [rates[s] for s in range(slot + 1, slot + ahead + 1) if s in rates]
            if base and nxt:
                ratios.append(max(nxt) / base)
        if len(ratios) < 36:
            return 1.5  # under six hours of history: a conservative default
        return max(1.0, _quantile(ratios, quantile))

    def forecast(
        self,
        history: Sequence[LoadSample],
        now_s: float,
        horizon_s: float,
        quantile: float | None = None,
    ) -> Forecast:
        """Bound the load over [now, now + horizon) at ``quantile`` (default: the SLO's)."""
        rates = {
            self._slot(s.start_s): s.rate
            for s in history
            if s.rate is not None and s.start_s < now_s  # never the future
        }
        now_slot = self._slot(now_s)
        recent = [rates[s] for s in range(now_slot - self.recent_windows, now_slot) if s in rates]
        if not recent:
            return Forecast(None, None, None, "none")
        level = recent[-1]
        ahead = max(1, math.ceil(horizon_s / self.window_s))
        upper = max(recent) * self._jump(rates, now_slot, ahead, quantile or self.quantile)
        seasonal = [
            e
            for e in (self._seasonal(rates, s, now_slot) for s in range(now_slot, now_slot + ahead))
            if e
        ]
        if seasonal:
            point = (level + seasonal[0]) / 2
            peak = max(level, *seasonal)
            return Forecast(point, peak, max(upper, *seasonal), "level+seasonal")
        return Forecast(level, level, upper, "level")
