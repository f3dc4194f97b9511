"""Load forecast from history only: the recent level, how far load has jumped before, and
the seasonal shape (same time yesterday / last week) times the recent trend.

The forecaster never sees the future: it gets the samples before ``now`` and
bounds the windows in [now, now + horizon). Its upper bound is the recent
level (the highest of the last few windows) times an upper quantile of the
jumps observed over the same horizon in the past week (learned, not
configured), or the seasonal estimate when that is higher (a daily peak that
is due). How many windows the level spans is learned too: a long span rides
out short dips and needs a small jump factor, a short span follows the load
down sooner but needs a larger one; which is better depends on the trace, so
each candidate span is scored on the past week by quantile loss and the best
is used. Outage windows are cleaned out first (``clean_outages``), so
a silent metric neither drags the level down nor teaches the forecaster that
load can drop to zero.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from tideflow.broker.load import LoadSample

DAY_S = 86400.0
WEEK_S = 7 * DAY_S
HISTORY_S = WEEK_S + DAY_S  # the load history a forecast reads: a week and a day


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
    recent: deque[float] = deque()  # the last ``lookback`` rates kept, oldest first
    ordered: list[float] = []  # the same rates, sorted: the median without a sort per window
    for sample in samples:
        rate = sample.rate
        if rate is not None and len(recent) >= 6 and rate < fraction * _median(ordered):
            rate = None
        cleaned.append(LoadSample(sample.start_s, rate))
        if rate is not None:
            recent.append(rate)
            bisect.insort(ordered, rate)
            if len(recent) > lookback:
                del ordered[bisect.bisect_left(ordered, recent.popleft())]
    return cleaned


def _median(ordered: list[float]) -> float:
    """``statistics.median`` of an already sorted list."""
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _pinball(actual: float, bound: float, quantile: float) -> float:
    """The quantile (pinball) loss: a proper score for a ``quantile`` bound."""
    if actual > bound:
        return quantile * (actual - bound)
    return (1 - quantile) * (bound - actual)


def _trailing_max(values: Sequence[float | None], width: int) -> list[float | None]:
    """``out[i]`` = the highest of ``values[i - width + 1 .. i]`` (gaps skipped), in O(n)."""
    out: list[float | None] = []
    window: deque[int] = deque()  # indices of a decreasing run of values
    for index, value in enumerate(values):
        while window and window[0] <= index - width:
            window.popleft()
        if value is not None:
            while window and values[window[-1]] <= value:  # type: ignore[operator]
                window.pop()
            window.append(index)
        out.append(values[window[0]] if window else None)
    return out


@dataclass(frozen=True)
class JumpModel:
    """How the upper bound is made: ``factor`` x the highest of the last ``level_windows``."""

    level_windows: int
    factor: float
    loss: float | None  # its mean quantile loss over the past week (how it was chosen)


# Shared by every forecaster: the broker makes one per step, and a fit holds for
# `refit_windows` windows (the same history gives the same fit).
@lru_cache(maxsize=64)
def _fit(
    values: tuple[float | None, ...], level_windows: tuple[int, ...], ahead: int, quantile: float
) -> JumpModel:
    ahead_max = _trailing_max(values, ahead)
    # Evaluate at index i whose next `ahead` windows precede the fit's slot.
    indices = range(level_windows[-1] - 1, len(values) - ahead)
    best: JumpModel | None = None
    for span in level_windows:
        levels = _trailing_max(values, span)
        pairs = [
            (nxt, level)
            for i in indices
            if values[i] is not None
            and (level := levels[i])
            and (nxt := ahead_max[i + ahead]) is not None
        ]
        if len(pairs) < 36:
            continue
        factor = max(1.0, _quantile([n / b for n, b in pairs], quantile))
        loss = sum(_pinball(n, factor * b, quantile) for n, b in pairs) / len(pairs)
        if best is None or best.loss is None or loss < best.loss:
            best = JumpModel(span, factor, loss)
    if best is None:  # under six hours of history: a conservative default
        best = JumpModel(level_windows[0], 1.5, None)
    return best


class LoadForecaster:
    def __init__(
        self,
        window_s: float,
        *,
        quantile: float = 0.995,
        level_windows: Sequence[int] = (3, 6, 12, 24, 36),
        jump_windows: int = 7 * 144,
        trend_windows: int = 6,
        refit_windows: int = 6,
    ) -> None:
        if not level_windows or min(level_windows) < 1:
            raise ValueError(f"level_windows must be whole numbers >= 1 (got {level_windows!r})")
        self.window_s = window_s
        self.quantile = quantile
        self.level_windows = tuple(sorted(set(level_windows)))
        self.jump_windows = jump_windows
        self.trend_windows = trend_windows
        # The jump model is refitted every `refit_windows` windows from the history
        # before that slot, so a replay at any slot gives the same answer.
        self.refit_windows = max(1, refit_windows)

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

    def jump_model(
        self, rates: dict[int, float], now_slot: int, ahead: int, quantile: float
    ) -> JumpModel:
        """The level span and jump factor whose bound scored best over the past week.

        For each candidate span k, over the windows of the past week: the ratio of
        the highest load in the ``ahead`` windows that followed to the highest of the
        k windows up to it; the factor is its ``quantile``. Every candidate so covers
        the same share of the past; the span kept is the one whose bound (factor x
        level) had the lowest quantile (pinball) loss, which charges both the
        capacity held above the load and, more heavily, the load a bound missed.
        """
        fit_slot = now_slot - now_slot % self.refit_windows
        first = fit_slot - self.jump_windows - ahead - self.level_windows[-1] + 1
        values = tuple(rates.get(slot) for slot in range(first, fit_slot))
        return _fit(values, self.level_windows, ahead, quantile)

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
        ahead = max(1, math.ceil(horizon_s / self.window_s))
        model = self.jump_model(rates, now_slot, ahead, quantile or self.quantile)
        recent = [rates[s] for s in range(now_slot - 3, now_slot) if s in rates]
        if not recent:  # the last half hour is a data gap: no level to build on
            return Forecast(None, None, None, "none")
        level = recent[-1]
        span = [rates[s] for s in range(now_slot - model.level_windows, now_slot) if s in rates]
        upper = max(span) * model.factor
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
