"""A cron day/night schedule: the baseline an operations team writes instead of a broker.

For each hour of the day, the highest load seen at that hour over the past
``days`` days, re-learned once a day at midnight, times ``1 + headroom``.
It is fed to the same policy mechanics as the tidal forecast (whole nodes,
growing at once on a measured shortfall, lending after the cooldown), so a
comparison with it measures the forecast, not the plumbing. Before a first
full day of history it falls back to the highest load seen so far.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tideflow.broker.forecast import DAY_S, Forecast
from tideflow.broker.load import LoadSample

HOUR_S = 3600.0


class CronSchedule:
    def __init__(self, *, headroom: float = 0.0, days: int = 7) -> None:
        if headroom < 0 or days < 1:
            raise ValueError(
                f"cron schedule: need headroom >= 0 and days >= 1 ({headroom}, {days})"
            )
        self.headroom = headroom
        self.days = days
        self._learned: dict[float, dict[int, float]] = {}  # midnight -> hour -> highest rate

    def _schedule(self, history: Sequence[LoadSample], midnight: float) -> dict[int, float]:
        schedule = self._learned.get(midnight)
        if schedule is None:
            schedule = {}
            since = midnight - self.days * DAY_S
            for sample in history:
                if sample.rate is not None and since <= sample.start_s < midnight:
                    hour = int(sample.start_s % DAY_S // HOUR_S)
                    schedule[hour] = max(schedule.get(hour, 0.0), sample.rate)
            self._learned = {midnight: schedule}  # only today's schedule is ever asked again
        return schedule

    def forecast(self, history: Sequence[LoadSample], now_s: float, horizon_s: float) -> Forecast:
        """The scheduled rate for the hours that [now, now + horizon) touches."""
        schedule = self._schedule(history, math.floor(now_s / DAY_S) * DAY_S)
        first = math.floor(now_s / HOUR_S)
        last = math.floor((now_s + max(horizon_s, 1.0) - 1e-6) / HOUR_S)
        hours = {int(h % 24) for h in range(first, last + 1)}
        scheduled = [schedule[h] for h in hours if h in schedule]
        if not scheduled:  # no full day learned yet: the highest load seen so far
            scheduled = [s.rate for s in history if s.rate is not None and s.start_s < now_s]
        if not scheduled:
            return Forecast(None, None, None, "none")
        rate = max(scheduled) * (1 + self.headroom)
        return Forecast(rate, rate, rate, "cron")
