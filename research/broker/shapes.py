"""Load shapes the production traces do not have, laid over one of them.

A broker tuned on two weeks of two traces has seen neither a weekend, a
holiday, a step change nor a slow drift. Each shape here multiplies a base
trace's rate window by window, so the burstiness stays the real trace's and
only the slow shape is synthetic:

* ``weekly``: days 5 and 6 of every week at 60% (a weekend);
* ``holiday``: day 9 at 35%, once (last week's same day was a normal day);
* ``step``: from day 8 on, 1.5x (a new client; the past week never saw it);
* ``drift``: growing linearly to 1.6x over 14 days (adoption).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tideflow.broker.forecast import DAY_S
from tideflow.broker.load import LoadSample, LoadSource


def _weekly(t: float) -> float:
    return 0.6 if int(t // DAY_S) % 7 in (5, 6) else 1.0


def _holiday(t: float) -> float:
    return 0.35 if int(t // DAY_S) == 9 else 1.0


def _step(t: float) -> float:
    return 1.5 if t >= 8 * DAY_S else 1.0


def _drift(t: float) -> float:
    return 1.0 + 0.6 * min(1.0, max(0.0, t / (14 * DAY_S)))


SHAPES: dict[str, Callable[[float], float]] = {
    "weekly": _weekly,
    "holiday": _holiday,
    "step": _step,
    "drift": _drift,
}


class BoundedLoad(LoadSource, Protocol):
    """A load source with its own time range, like a trace."""

    @property
    def start_s(self) -> float: ...

    @property
    def end_s(self) -> float: ...


@dataclass(frozen=True)
class ShapedLoad:
    """``base``'s load times ``SHAPES[shape]`` at each window's start (gaps stay gaps)."""

    base: BoundedLoad
    shape: str

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"unknown shape {self.shape!r}; one of {', '.join(SHAPES)}")

    @property
    def window_s(self) -> float:
        return self.base.window_s

    @property
    def start_s(self) -> float:
        return self.base.start_s

    @property
    def end_s(self) -> float:
        return self.base.end_s

    def samples(self, start_s: float, end_s: float) -> list[LoadSample]:
        factor = SHAPES[self.shape]
        return [
            LoadSample(s.start_s, None if s.rate is None else s.rate * factor(s.start_s))
            for s in self.base.samples(start_s, end_s)
        ]
