"""Calibrate the forecast's upper bound to the inference SLO, from outcomes already seen.

Operators state an SLO ("inference covers its load in 99.5% of windows"), not
a quantile of load jumps; the bound that delivers that SLO depends on the
trace (how bursty it is), the whole-node rounding and the headroom. So the
forecast's upper bound is scaled by ``exp(margin)``, and the margin is
adjusted online as in adaptive conformal inference (Gibbs and Candes, 2021):
a window whose load the inference GPUs did not cover raises it by
``step * target``, a covered window lowers it by ``step * (1 - target)``, so
that misses settle at ``1 - target`` of the windows. The margin is in log
space rather than the quantile itself because the quantile that a bursty
trace needs sits near 1, where raising it saturates and the guarantee is
lost. Only outcomes of windows already measured are used.

What it can promise, on any load (``promised_misses``): while the margin
never has to rise past ``high``, the misses over T windows are at most
``(1 - target) * T + (high - start) / step``. Each miss raises the margin by
``step * target`` and each hit lowers it by ``step * (1 - target)``; the
floor at ``low`` only ever raises it, so after T windows it is at least
``start + step * (misses - (1 - target) * T)``, and it is at most ``high``.
With the defaults that is 0.5% of the windows plus 10: over 14 days of
10-minute windows (2,016) at least 99.0%, over 30 days 99.27%, tending to
99.5%. When the margin is held at ``high`` (the bound 1.65x is not enough,
or inference needs more GPUs than it may have) the promise is void, and the
windows where that happened are counted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from tideflow.broker.forecast import Forecast


@dataclass(frozen=True)
class SloCalibration:
    target: float = 0.995  # share of windows where inference must cover its load
    step: float = 0.05  # a miss adds about 5% to the bound; ~1.4 days of hits take it back
    low: float = -0.5  # the bound is never scaled below exp(-0.5) = 0.61x ...
    high: float = 0.5  # ... nor above exp(0.5) = 1.65x

    def __post_init__(self) -> None:
        if not 0.5 < self.target < 1:
            raise ValueError(f"SLO target must be within (0.5, 1) (got {self.target})")
        if not self.low <= 0 <= self.high or self.step <= 0:
            raise ValueError(
                f"need low <= 0 <= high and step > 0 (got {self.low}, {self.high}, {self.step})"
            )

    def next(self, margin: float, covered: bool) -> float:
        """The margin for the next window, after one window's outcome."""
        miss = 0.0 if covered else 1.0
        return min(self.high, max(self.low, margin + self.step * (miss - (1 - self.target))))

    def saturated(self, margin: float, covered: bool) -> bool:
        """Whether this outcome would push the margin past ``high`` (the promise is void)."""
        return not covered and margin + self.step * self.target > self.high

    def promised_misses(self, windows: int, start: float = 0.0) -> float:
        """The most windows out of ``windows`` missed while the margin stays under ``high``."""
        return (1 - self.target) * windows + (self.high - start) / self.step

    def replay(self, outcomes: Iterable[bool]) -> float:
        """The margin after ``outcomes`` (covered or not, oldest first), from 0."""
        margin = 0.0
        for covered in outcomes:
            margin = self.next(margin, covered)
        return margin


def scaled(forecast: Forecast, margin: float) -> Forecast:
    """The forecast with its upper bound scaled by ``exp(margin)``."""
    if forecast.upper is None or margin == 0:
        return forecast
    return replace(forecast, upper=forecast.upper * math.exp(margin))


@dataclass(frozen=True)
class TrainingWork:
    """Training's time on the broker's devices over a past span, and its forced stops.

    What the running broker weighs against its lost-work budget. ``recorded_lost_gpu_s``
    is the work stops threw away that was recorded (a stop past its grace loses the
    time since the gang's checkpoint); ``stopped_gpus`` counts, per stop, the GPUs
    stopped, each of which also costs the checkpoint written on notice and the restart.
    """

    trained_gpu_s: float
    recorded_lost_gpu_s: float = 0.0
    stopped_gpus: int = 0

    def lost_gpu_s(self, stop_cost_s: float) -> float:
        """GPU-seconds lost, each stopped GPU costing ``stop_cost_s`` beyond what was recorded."""
        return self.recorded_lost_gpu_s + stop_cost_s * self.stopped_gpus


@dataclass(frozen=True)
class LostWorkBudget:
    """Spend training's unspent lost-work budget on lending.

    Operators state how much training work preemptions may cost ("at most 1% of
    training GPU-hours"). The lend horizon's bound (what inference keeps so that
    a lend is not taken back soon) costs training capacity whatever the trace;
    on a trace where lends are rarely taken back, the budget goes unspent. So
    the bound is scaled by ``exp(margin)``, with the margin proportional to the
    work lost so far beyond the budget accrued so far,
    ``margin = (lost - budget * training) / scale``, clipped to ``[low, high]``:
    under budget the bound shrinks and more is lent, down to ``exp(low)``. By
    default ``high`` is 0: over budget the bound is the fixed one, no more
    cautious (a brake, ``high > 0``, holds more GPUs; on the benchmark's diurnal
    load it cost 14 points of the oracle share and lost as much work, because
    there the work is lost growing for unforeseeable bursts, not to lends taken
    back). Only work already lost counts.

    What it promises: it lends beyond the fixed bound only while the work lost
    so far is under the budget accrued so far, less ``high * scale`` (with
    ``high`` 0: under budget). It does not cap lost work; the windows where
    the margin is held at ``high`` (over budget) are counted
    (``saturated``). ``scale`` is a day of the whole cluster's budget
    (``for_cluster``): for 200 GPUs and a 1% budget, 48 GPU-hours of unspent
    budget shrink the bound by ``exp(-1)``, so the floor ``exp(-0.25)`` is
    reached with 12 GPU-hours unspent.
    """

    budget: float  # share of training GPU-time that preemptions may cost
    scale_gpu_s: float  # a deficit of this many GPU-seconds moves the margin by 1
    low: float = -0.25  # the lend bound is never scaled below exp(-0.25) = 0.78x ...
    high: float = 0.0  # ... nor above exp(high) (1: the fixed bound)

    def __post_init__(self) -> None:
        if not 0 < self.budget < 1 or self.scale_gpu_s <= 0:
            raise ValueError(
                "lost-work budget: need 0 < budget < 1 and scale_gpu_s > 0 "
                f"(got {self.budget}, {self.scale_gpu_s})"
            )
        if not self.low <= 0 <= self.high:
            raise ValueError(f"need low <= 0 <= high (got {self.low}, {self.high})")

    @classmethod
    def for_cluster(
        cls,
        budget: float,
        total_gpus: int,
        day_s: float = 86400.0,
        low: float = -0.25,
        high: float = 0.0,
    ) -> LostWorkBudget:
        """The scale is a day of the budget of the whole cluster."""
        return cls(budget, budget * total_gpus * day_s, low=low, high=high)

    def margin(self, lost_gpu_s: float, training_gpu_s: float) -> float:
        """The lend bound's log-scale margin after ``lost_gpu_s`` lost of ``training_gpu_s``."""
        deficit = lost_gpu_s - self.budget * training_gpu_s
        return min(self.high, max(self.low, deficit / self.scale_gpu_s))

    def saturated(self, lost_gpu_s: float, training_gpu_s: float) -> bool:
        """Whether the margin is held at ``high``: over budget, lending no more than that."""
        return (lost_gpu_s - self.budget * training_gpu_s) / self.scale_gpu_s > self.high

    def lends_beyond_the_bound_under(self, training_gpu_s: float) -> float:
        """The most GPU-seconds lost by ``training_gpu_s`` at which it still lends beyond
        ``exp(high)`` times the fixed bound."""
        return self.budget * training_gpu_s + self.high * self.scale_gpu_s
