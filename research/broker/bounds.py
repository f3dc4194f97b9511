"""Bounds on what a forecast could reach: not policies, references for the benchmark.

Each replaces the broker's next-window forecast in the simulator and keeps the
rest of its mechanics as ``ResearchConfig.bound_mechanics`` says:

* ``oracle`` knows each window's load;
* ``oracle-burst-blind`` knows it but for the bursts, on a load that says where
  they are (``SyntheticLoad``), holding room for a burst by plan;
* ``oracle-hindsight`` is a forecast fitted to the very trace it is scored on
  (``research.broker.hindsight``), ``-cross`` to the other half of the trace.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from research.broker.hindsight import hindsight_bounds
from tideflow.broker.backlog import Backlog
from tideflow.broker.forecast import Forecast
from tideflow.broker.load import LoadSample, LoadSource
from tideflow.broker.simulate import TidalPlanner
from tideflow.broker.simulation import Plan, Window

# Not policies: what a forecast could reach (``oracle-hindsight``: a richer forecast
# fitted to the trace it is scored on; ``-cross``: to the other half of the trace).
BOUNDS = ("oracle", "oracle-burst-blind", "oracle-hindsight", "oracle-hindsight-cross")
# The bounds that replace tidal's next-window forecast and may keep the rest of tidal.
FORECAST_BOUNDS = ("oracle", "oracle-hindsight", "oracle-hindsight-cross")
MECHANICS = ("lean", "cooldown", "lend", "tidal")  # ``ResearchConfig.bound_mechanics``


def burst_blind_plan(
    load: LoadSource,
    samples: list[LoadSample],
    insured_share: float,
    room: float | None = None,
) -> tuple[list[float | None], list[float | None]]:
    """The burst-blind bound's knowledge and plan, per window: the load without its
    burst, and what it holds room for (that load times ``room``, by default the burst
    factor, in the ``insured_share`` of windows of least load, where the room costs
    least; the load alone elsewhere). Bursts fall on windows no one can foresee, so a
    share of the windows insured catches about that share of them; holding the room
    where load is least is the cheapest way to catch a given share. With every window
    insured and a smaller room, it is the bound of a policy that holds the same room at
    every hour, as a forecast's quantile does."""
    burst_at = getattr(load, "burst_at", None)
    factor = getattr(load, "burst_factor", None)
    if burst_at is None or factor is None:
        raise ValueError(
            "policy 'oracle-burst-blind' needs a load that says which windows burst "
            f"(burst_at and burst_factor, as SyntheticLoad has); {type(load).__name__} does not"
        )
    if not 0 <= insured_share <= 1:
        raise ValueError(f"insured_share must be within [0, 1] (got {insured_share})")
    if room is not None and not room >= 1:
        raise ValueError(f"burst_room must be at least 1, the calm load (got {room})")
    base = [
        None if s.rate is None else s.rate / factor if burst_at(s.start_s) else s.rate
        for s in samples
    ]
    known = sorted((b, i) for i, b in enumerate(base) if b is not None)
    insured = {i for _, i in known[: math.ceil(insured_share * len(known))]}
    held = factor if room is None else room
    plan = [None if b is None else b * held if i in insured else b for i, b in enumerate(base)]
    return base, plan


class OraclePlanner:
    """The same decisions fed each window's true load (lean: with no cooldown and its
    lend bound the load itself), to bound what any forecast could achieve on a trace."""

    def __init__(self, tidal: TidalPlanner, *, tidal_lend: bool, keeps_cooldown: bool) -> None:
        self.tidal = tidal  # tidal's own state (calibration, budget) runs on beside it
        self.tidal_lend = tidal_lend
        self.keeps_cooldown = keeps_cooldown

    def plan(
        self, index: int, samples: Sequence[LoadSample], windows: Sequence[Window], backlog: Backlog
    ) -> Plan:
        tidal = self.tidal.plan(index, samples, windows, backlog)
        rate = samples[index].rate
        exact = Forecast(rate, rate, rate, "oracle")
        lend = tidal.lend_forecast if self.tidal_lend else exact
        return Plan(exact, lend, rate, forget_lend=not self.keeps_cooldown)

    def metrics(self, scored_windows: int, trained_gpu_s: float) -> dict[str, Any]:
        return self.tidal.metrics(scored_windows, trained_gpu_s)


class BurstBlindPlanner:
    """Each window's load known but for its burst, room for a burst held by plan, no
    cooldown (it knows the future's load): a tighter bound than the oracle."""

    def __init__(
        self,
        tidal: TidalPlanner,
        base: list[float | None],
        held: list[float | None],
        lend_windows: int,
    ) -> None:
        self.tidal, self.base, self.held, self.lend_windows = tidal, base, held, lend_windows

    def plan(
        self, index: int, samples: Sequence[LoadSample], windows: Sequence[Window], backlog: Backlog
    ) -> Plan:
        self.tidal.plan(index, samples, windows, backlog)
        ahead = [p for p in self.held[index : index + self.lend_windows] if p is not None]
        top = max(ahead) if ahead else None
        base, held = self.base[index], self.held[index]
        forecast = Forecast(base, held, held, "burst-blind")
        return Plan(forecast, Forecast(base, top, top, "burst-blind"), base, forget_lend=True)

    def metrics(self, scored_windows: int, trained_gpu_s: float) -> dict[str, Any]:
        return self.tidal.metrics(scored_windows, trained_gpu_s)


class HindsightPlanner:
    """A forecast fitted to the trace (the first windows, with nothing to fit on, keep
    tidal's); lean, its lend bound is its own bounds over the lend horizon, which read
    loads not yet seen: optimistic on purpose."""

    def __init__(
        self,
        tidal: TidalPlanner,
        fitted: list[float | None],
        room: float,
        lend_windows: int,
        *,
        tidal_lend: bool,
        keeps_cooldown: bool,
    ) -> None:
        self.tidal, self.fitted, self.room, self.lend_windows = tidal, fitted, room, lend_windows
        self.tidal_lend = tidal_lend
        self.keeps_cooldown = keeps_cooldown

    def plan(
        self, index: int, samples: Sequence[LoadSample], windows: Sequence[Window], backlog: Backlog
    ) -> Plan:
        tidal = self.tidal.plan(index, samples, windows, backlog)
        own = self.fitted[index]
        if own is None:
            return tidal
        ahead = [b for b in self.fitted[index : index + self.lend_windows] if b is not None]
        bound = own * self.room
        lend = (
            tidal.lend_forecast
            if self.tidal_lend
            else Forecast(None, max(ahead) * self.room, max(ahead) * self.room, "hindsight")
        )
        return Plan(
            Forecast(None, bound, bound, "hindsight"),
            lend,
            tidal.measured_rps,
            forget_lend=not self.keeps_cooldown,
        )

    def metrics(self, scored_windows: int, trained_gpu_s: float) -> dict[str, Any]:
        return self.tidal.metrics(scored_windows, trained_gpu_s)


def hindsight_fitted(
    samples: Sequence[LoadSample], step: float, quantile: float, policy: str
) -> list[float | None]:
    """The hindsight bound's fitted bounds, per window, for ``policy``."""
    return hindsight_bounds(samples, step, quantile, cross_fitted=policy.endswith("-cross"))


def lend_windows(lend_horizon_s: float, step: float) -> int:
    """Windows of ``step`` over the lend horizon (at least one)."""
    return max(1, math.ceil(lend_horizon_s / step))
