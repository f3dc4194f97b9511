"""Fakes shared by the tests: one of each, so that tests do not each write their own."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

from tideflow.broker.load import LoadSample


class Clock:
    """A clock the test moves by hand (``clock.now += 60``), for code that takes a
    ``clock`` callable; its ``sleep`` advances time instead of waiting, and then calls
    ``on_sleep(now)`` so that the world can change meanwhile."""

    def __init__(self, now: float = 1_000.0, on_sleep: Callable[[float], object] | None = None):
        self.now = now
        self.on_sleep = on_sleep

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep(self.now)


class WindowedLoad:
    """A load source (``tideflow.broker.load.LoadSource``) of fixed windows from ``from_s``
    (time 0 unless told): ``rate`` is the rate of every window, or a function of a
    window's start (None: a gap).

    As the protocol says, it answers every window whose start lies in
    [start_s, end_s), the one still running at ``end_s`` included; ``ended_only`` leaves
    that one out, as a source that reports a window only once it is over. ``until_s``
    ends the load: no window starts at or after it.
    """

    def __init__(
        self,
        rate: float | Callable[[float], float | None],
        window_s: float = 600.0,
        *,
        ended_only: bool = False,
        from_s: float = 0.0,
        until_s: float = math.inf,
    ) -> None:
        self.rate = rate
        self.window_s = window_s
        self.ended_only = ended_only
        self.from_s = from_s
        self.until_s = until_s

    @classmethod
    def series(cls, rates: list[float | None], window_s: float = 600.0) -> WindowedLoad:
        """The rates of the first ``len(rates)`` windows, then nothing."""
        return cls(
            lambda start: rates[int(start // window_s)], window_s, until_s=len(rates) * window_s
        )

    def rate_at(self, start_s: float) -> float | None:
        return self.rate(start_s) if callable(self.rate) else self.rate

    def samples(self, start_s: float, end_s: float) -> list[LoadSample]:
        step = self.window_s
        found = []
        for index in itertools.count(math.ceil(max(start_s, self.from_s) / step)):
            start = index * step
            if start >= min(end_s, self.until_s) or (self.ended_only and start + step > end_s):
                return found
            found.append(LoadSample(start, self.rate_at(start)))
        raise AssertionError("unreachable")  # itertools.count never ends
