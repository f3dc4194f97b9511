"""The per-GPU throughput inference serves within its latency SLO, learned from serving.

Operators seldom know how many requests/s one inference GPU serves before its
latency SLO breaks: set too high, inference misses the SLO in every busy
window; too low, GPUs sit idle. So, when the serving side's latency is
measured, the broker learns that rate from the windows it has already served.

Each window gives one observation (``Served``): the request rate, the GPUs that
served it, and the serving side's signal against its SLO (the latency at the
SLO's percentile, or the share of requests over the latency target); the
window *broke* the SLO when the signal is above its limit. The per-GPU rate of
a window is its rate over its GPUs. ``ThroughputLearner.learn`` replays the
observations, oldest first, from the rate learned before them (``start``; the
configured rate when nothing was learned before):

* **Down at once, from breaches**: when more than ``outliers`` remembered
  windows broke the SLO at per-GPU rates below the estimate, the estimate
  drops to ``backoff`` times the lowest of them that is not an outlier (the
  ``outliers`` lowest are taken for noise). Holds remembered from before are
  forgotten then: the capacity they showed is gone (a slower model version).
* **Up only from evidence**: when more than ``outliers`` remembered windows
  held the SLO at per-GPU rates above the estimate, the estimate rises to the
  highest of them that is not an outlier, but never closer than ``backoff``
  to the lowest breach above the estimate (not an outlier) in all the windows
  replayed, before or after (not only the remembered ones: near the capacity,
  noise lets a few windows hold above it, and a breach forgotten would let
  them pull the estimate past it). No window above the estimate, no rise: it
  never rises because nothing broke.
* **Gaps teach nothing**: windows without a rate (an outage, zero, None),
  without GPUs or without a signal are skipped, neither breach nor hold.
* **Configured until seen**: the configured rate holds until ``min_windows``
  usable windows were seen (unless a learned rate is carried in); windows
  older than ``memory`` usable windows are forgotten by the rules above, so
  a changed capacity is followed.

It is a pure function of the observations and the rate it starts from (no
clock, no state kept between calls), so the service replays it at every step
from its journal and the load and latency history, as it does the SLO
calibration, starting from the rate its journal's last decision records
(``recorded``): evidence that aged out of the history still holds the
estimate where it put it, since a rate is never raised for want of breaches.
Replaying evidence already counted leaves the estimate where it was (each
rule sets it from windows' rates, not by a step from where it stands, and no
hold replayed lifts it past a breach the replay holds; the tests check it on
a replayed week).

What it assumes about the serving system, and what breaks it:

* The latency at the SLO's percentile rises with the per-GPU load, so that
  below some per-GPU rate the SLO holds and above it it breaks (a queue).
  Latency that breaks for other reasons (a slow dependency, a bad deploy, a
  cold cache after a restart) reads as a breach at a low rate and lowers the
  estimate: inference then holds more GPUs than it needs, which is safe for
  the SLO and costs training. The estimate never drops below ``floor`` times
  the configured rate.
* The per-GPU throughput is stable over ``memory`` windows. A change in the
  request mix (longer prompts) or a new model version is a new throughput; a
  slower one is followed at once (its breaches), a faster one only as far as
  windows served above the estimate show it, and only once the slower one's
  breaches left the history replayed (the service's week).
* The load is spread evenly over the GPUs counted for the window (the
  service counts the most GPUs inference held during the window, so a
  window's per-GPU rate is never overstated).
* Windows above the estimate are rare when the broker plans at the estimate
  (only where its forecast falls short), so an estimate set too low rises
  slowly; it is never raised by extrapolating a latency curve.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Served:
    """One window as served: its request rate, the GPUs serving it, the SLO signal."""

    rate_rps: float | None  # None or <= 0: a gap (an outage), never "no load"
    gpus: int
    signal: float | None  # latency at the SLO's percentile, or the share over target


@dataclass(frozen=True)
class Throughput:
    rps: float  # per GPU, within the latency SLO
    configured: float
    windows: int  # usable windows seen
    reason: str

    @property
    def learned(self) -> bool:
        return self.rps != self.configured


@dataclass(frozen=True)
class ThroughputLearner:
    min_windows: int = 36  # usable windows before the configured rate is revised
    outliers: int = 1  # breaches (or holds) at the extreme taken for noise
    backoff: float = 0.95  # the estimate kept this far under the breaches seen
    memory: int = 288  # usable windows a breach or hold is remembered
    floor: float = 0.2  # never below this share of the configured rate

    def __post_init__(self) -> None:
        if self.min_windows < 1 or self.outliers < 0 or self.memory <= self.outliers:
            raise ValueError(
                "throughput learner: need min_windows >= 1, outliers >= 0 and memory > "
                f"outliers (got {self.min_windows}, {self.outliers}, {self.memory})"
            )
        if not 0 < self.backoff <= 1 or not 0 < self.floor <= 1:
            raise ValueError(
                f"throughput learner: backoff and floor are within (0, 1] "
                f"(got {self.backoff}, {self.floor})"
            )

    def learn(
        self,
        observations: Iterable[Served],
        configured: float,
        slo: float,
        start: float | None = None,
    ) -> Throughput:
        """The per-GPU rate after ``observations`` (oldest first), from ``start`` (learned
        before them; None: the configured rate); ``slo``: the signal's limit."""
        if configured <= 0 or slo <= 0 or (start is not None and start <= 0):
            raise ValueError(
                f"need configured, slo and start > 0 (got {configured}, {slo}, {start})"
            )
        estimate = configured if start is None else start
        points = [point for window in observations if (point := _point(window, slo))]
        every_breach = sorted(per_gpu for per_gpu, broke in points if broke)
        breaches: deque[tuple[int, float]] = deque()  # (usable window number, per-GPU rate)
        holds: deque[tuple[int, float]] = deque()  # those above the estimate when seen
        seen = 0
        for per_gpu, broke in points:
            seen += 1
            if broke:
                breaches.append((seen, per_gpu))
            elif per_gpu > estimate:
                holds.append((seen, per_gpu))
            for remembered in (breaches, holds):
                while remembered and remembered[0][0] <= seen - self.memory:
                    remembered.popleft()
            if seen < self.min_windows and start is None:
                continue
            below = sorted(x for _, x in breaches if x < estimate)
            if len(below) > self.outliers:
                estimate = max(self.floor * configured, self.backoff * below[self.outliers])
                holds.clear()
                continue
            above = sorted((x for _, x in holds if x > estimate), reverse=True)
            if len(above) > self.outliers:
                rise = above[self.outliers]
                broke_above = [x for x in every_breach if x >= estimate]
                if len(broke_above) > self.outliers:
                    rise = min(rise, self.backoff * broke_above[self.outliers])
                estimate = max(estimate, rise)
        learned_before = start is not None and start != configured
        return Throughput(
            estimate, configured, seen, self._reason(estimate, configured, seen, learned_before)
        )

    def _reason(self, estimate: float, configured: float, seen: int, before: bool) -> str:
        if seen < self.min_windows and not before:
            return (
                f"per-GPU throughput {configured:g} rps as configured: {seen} of "
                f"{self.min_windows} windows with load and latency seen"
            )
        if estimate == configured:
            return (
                f"per-GPU throughput {configured:g} rps as configured: {seen} windows "
                "showed no breach below it and no held window above it"
            )
        return (
            f"per-GPU throughput learned {estimate:.4g} rps from {seen} windows "
            f"(was {configured:g} configured)"
        )


def _point(window: Served, slo: float) -> tuple[float, bool] | None:
    """The window's per-GPU rate and whether it broke the SLO; None for a gap (an outage,
    no GPUs, no signal)."""
    rate, signal = window.rate_rps, window.signal
    if not rate or rate <= 0 or window.gpus <= 0 or signal is None or math.isnan(signal):
        return None
    return rate / window.gpus, signal > slo


_LEARNED = re.compile(
    r"per-GPU throughput learned ([0-9.e+-]+) rps .*\(was ([0-9.e+-]+) configured\)"
)


def recorded(reason: str, configured: float) -> float | None:
    """The rate a journaled reason says was learned, when learned from ``configured``
    (None: none learned, or from another configured rate: the operator's new rate
    starts the learning afresh)."""
    found = _LEARNED.search(reason)
    if found is None or found.group(2) != f"{configured:g}":
        return None
    try:
        return float(found.group(1))
    except ValueError:
        return None
