"""The broker's decisions replayed with the per-GPU throughput learned as it goes
(``research.broker.learning``): configured too high, the estimate comes down and the
SLO holds; too low, it rises only as far as windows held show; a slower model version
is followed at once.

No serving system runs here, so the serving side is a model
(``tideflow.broker.load.SyntheticLatency``), replayed over the seeded synthetic
diurnal load (with outage windows) with the broker's real forecaster, SLO
calibration and ``decide`` every window; the learner sees only the windows already
served, as the service does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from research.broker.learning import replay_learning
from tideflow.broker.load import SyntheticLatency, SyntheticLoad
from tideflow.broker.policy import PolicyConfig
from tideflow.broker.throughput import Served, ThroughputLearner

pytestmark = pytest.mark.research

TRUE_RPS = 25.0  # the model's per-GPU capacity at the latency SLO
SLO_S = 1.0
DAY = 144  # 10-minute windows
LEARNER = ThroughputLearner()


@dataclass
class Replay:
    """Per served window: its start, whether the latency SLO held, the GPUs, the estimate
    the broker planned with and the per-GPU rate served."""

    starts: list[float]
    held: list[bool]
    gpus: list[int]
    estimates: list[float]
    per_gpu: list[float]

    def attainment(self, start: int = 0) -> float:
        return sum(self.held[start:]) / len(self.held[start:])


def replay(
    factor: float,
    *,
    learn: bool = True,
    days: int = 10,
    capacity: Callable[[float], float] = lambda _t: TRUE_RPS,
    outages: float = 0.02,
) -> Replay:
    """The broker planning at ``factor`` times the true throughput (learning it or not)."""
    load = SyntheticLoad(mean_rps=1000.0, outage_probability=outages, seed=3)
    raw = load.samples(0.0, days * 86400.0)
    configured = PolicyConfig(
        total_gpus=160,
        per_gpu_rps=TRUE_RPS * factor,
        node_gpus=8,
        headroom=0.05,
        min_inference_gpus=8,
        lead_s=600.0,
    )
    windows = replay_learning(
        raw,
        configured,
        lambda start: SyntheticLatency(capacity(start), slo_s=SLO_S, window_s=600.0),
        SLO_S,
        learn=learn,
    )
    out = Replay([], [], [], [], [])
    for w in windows:
        if w.rate and w.latency is not None:
            out.starts.append(w.start_s)
            out.held.append(w.latency <= SLO_S)
            out.gpus.append(w.gpus)
            out.estimates.append(w.estimate)
            out.per_gpu.append(w.rate / w.gpus)
    return out


def test_a_throughput_set_too_high_breaks_the_slo_until_it_is_learned() -> None:
    """Configured 1.3x the truth: without learning the latency SLO breaks in busy windows
    every day; learning, the estimate comes down near the truth within a day and the SLO
    holds from then on."""
    blind = replay(1.3, learn=False)
    assert blind.attainment(DAY) < 0.95  # the scenario is hard: without learning it fails
    learning = replay(1.3)
    assert 0.85 * TRUE_RPS <= learning.estimates[-1] <= 1.05 * TRUE_RPS
    settled = next((i for i, e in enumerate(learning.estimates) if e <= 1.05 * TRUE_RPS), None)
    assert settled is not None and settled <= DAY  # a bounded number of windows: a day
    assert learning.attainment(settled) >= 0.985


def test_a_throughput_set_too_low_rises_only_as_far_as_windows_held_show() -> None:
    """Configured 0.7x the truth: every rise of the estimate is backed by windows that held
    the SLO at that per-GPU rate, it never passes the truth by more than the noise, and
    inference needs fewer GPUs than without learning while the SLO still holds."""
    blind = replay(0.7, learn=False)
    learning = replay(0.7)
    highest_held = 0.0
    for estimate, per_gpu, held in zip(
        learning.estimates, learning.per_gpu, learning.held, strict=True
    ):
        assert estimate <= max(0.7 * TRUE_RPS, highest_held) + 1e-9
        highest_held = max(highest_held, per_gpu) if held else highest_held
    assert max(learning.estimates) <= 1.06 * TRUE_RPS
    assert learning.estimates[-1] >= 1.1 * 0.7 * TRUE_RPS  # it did rise on the evidence
    assert sum(learning.gpus) < sum(blind.gpus)
    assert learning.attainment() >= 0.99


def test_a_slower_model_version_is_followed_at_once() -> None:
    """The true throughput drops from 25 to 18 rps per GPU on day 4 (a slower model): the
    estimate follows within half a day and the SLO holds again after that."""
    change = 4 * 86400.0
    learning = replay(1.0, capacity=lambda t: TRUE_RPS if t < change else 18.0)
    after = next(i for i, start in enumerate(learning.starts) if start >= change)
    settled = next(
        (i for i in range(after, len(learning.estimates)) if learning.estimates[i] <= 18.9), None
    )
    assert settled is not None and settled - after <= DAY // 2
    assert 0.85 * 18.0 <= learning.estimates[-1] <= 1.05 * 18.0
    assert learning.attainment(settled) >= 0.985


def test_replaying_what_was_already_counted_leaves_the_estimate() -> None:
    """The service replays its week at every step from the rate it last recorded, so
    windows already counted are counted again: that must not move the estimate."""
    served_week = replay(1.3, days=4)
    observations = [
        Served(x * g, g, 0.5 if held else 2.0)
        for x, g, held in zip(served_week.per_gpu, served_week.gpus, served_week.held, strict=True)
    ]
    for end in range(40, len(observations), 13):
        once = LEARNER.learn(observations[:end], 1.3 * TRUE_RPS, SLO_S)
        again = LEARNER.learn(observations[:end], 1.3 * TRUE_RPS, SLO_S, start=once.rps)
        assert again.rps == once.rps
