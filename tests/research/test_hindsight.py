"""The hindsight forecasts (``research.broker.hindsight``; ``policy="oracle-hindsight"``
and ``"oracle-hindsight-cross"``): a linear quantile regression of the next window's
load, fitted to the trace it is scored on or to the other half of it, as a reference
for how far a richer forecast than tidal's could go (``bench/broker.py --hindsight``).

Pure computation and simulation on seeded synthetic loads: no server is involved. The
regression is scikit-learn's, not ours.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from research.broker.hindsight import FEATURES, features, hindsight_bounds
from research.broker.simulate import ResearchConfig, simulate
from tideflow.broker import SyntheticLoad, synthetic_jobs
from tideflow.broker.load import LoadSample

pytestmark = pytest.mark.research

DAY = 86400.0
HOURLY = 3600.0  # a day of 24 windows and a week of 168 keep the fuzzed loads short


@settings(max_examples=60, deadline=None)
@given(
    rates=st.lists(
        st.one_of(st.none(), st.floats(min_value=0.5, max_value=1e6)), min_size=30, max_size=260
    ),
    data=st.data(),
)
def test_a_windows_features_are_known_before_it_starts(
    rates: list[float | None], data: st.DataObject
) -> None:
    """Whatever the loads from a window on, the features of that window (and of every
    window before it) are the same: a forecast made from them uses the past only."""
    cut = data.draw(st.integers(min_value=0, max_value=len(rates) - 1))
    changed = rates[:cut] + [
        data.draw(st.one_of(st.none(), st.floats(min_value=0.5, max_value=1e6)))
        for _ in rates[cut:]
    ]
    before = features([LoadSample(i * HOURLY, r) for i, r in enumerate(rates)], HOURLY)
    after = features([LoadSample(i * HOURLY, r) for i, r in enumerate(changed)], HOURLY)
    assert before[: cut + 1] == after[: cut + 1]
    assert all(row is None or len(row) == len(FEATURES) for row in before)


def test_the_same_window_yesterday_and_a_week_ago_are_read_where_they_exist() -> None:
    samples = [LoadSample(i * HOURLY, float(100 + i)) for i in range(200)]
    rows = features(samples, HOURLY)
    assert all(row is None for row in rows[:12])
    day = rows[30]
    assert day is not None and day[6] == 1.0 and day[8] == 0.0  # yesterday, no week yet
    assert day[5] == pytest.approx(__import__("math").log(100 + 30 - 24))
    week = rows[170]
    assert week is not None and week[8] == 1.0
    assert week[7] == pytest.approx(__import__("math").log(100 + 170 - 168))


@pytest.mark.parametrize("quantile", [0.9, 0.99])
def test_fitted_in_hindsight_the_bound_covers_its_quantile_of_the_windows(
    quantile: float,
) -> None:
    """A quantile regression fitted to the windows it predicts leaves about ``1 -
    quantile`` of them above its bound (what makes it the optimistic reference)."""
    load = SyntheticLoad(mean_rps=2000, seed=5)
    samples = load.samples(0, 6 * DAY)
    bounds = hindsight_bounds(samples, load.window_s, quantile)
    scored = [(b, s.rate) for b, s in zip(bounds, samples, strict=True) if b and s.rate]
    covered = sum(rate <= bound for bound, rate in scored) / len(scored)
    assert len(scored) > 800
    assert abs(covered - quantile) < 0.01


def test_fitted_on_the_other_half_it_covers_fewer_windows_than_in_hindsight() -> None:
    """Predicting each half from a fit to the other is a forecast that did not see the
    windows it is scored on: its coverage falls short of the in-hindsight fit's."""
    load = SyntheticLoad(mean_rps=2000, seed=5, noise=0.15)
    samples = load.samples(0, 8 * DAY)
    scored = {}
    for cross in (False, True):
        bounds = hindsight_bounds(samples, load.window_s, 0.99, cross_fitted=cross)
        pairs = [(b, s.rate) for b, s in zip(bounds, samples, strict=True) if b and s.rate]
        scored[cross] = sum(rate <= bound for bound, rate in pairs) / len(pairs)
    assert scored[True] < scored[False]
    with pytest.raises(ValueError, match=r"quantile must be within \(0, 1\)"):
        hindsight_bounds(samples, load.window_s, 1.0)


def test_more_room_over_the_hindsight_bound_never_covers_fewer_windows() -> None:
    """The benchmark bisects on the room for the smallest that reaches tidal's SLO: sound
    only if the SLO does not fall as the room grows; and training pays for the room."""
    load = SyntheticLoad(mean_rps=2000, seed=11)
    jobs = synthetic_jobs(seed=2, total_gpus=200, horizon_s=4 * DAY)
    runs = {
        room: simulate(
            load,
            jobs,
            ResearchConfig(policy="oracle-hindsight", per_gpu_rps=25.0, hindsight_room=room),
            start_s=0,
            end_s=4 * DAY,
        ).metrics
        for room in (0.7, 1.0, 1.4)
    }
    slo = [runs[r]["slo_attainment"] for r in (0.7, 1.0, 1.4)]
    inference = [runs[r]["mean_inference_gpus"] for r in (0.7, 1.0, 1.4)]
    assert slo[0] < slo[1] <= slo[2]
    assert inference[0] < inference[1] < inference[2]
    with pytest.raises(ValueError, match="hindsight_room must be > 0"):
        ResearchConfig(policy="oracle-hindsight", hindsight_room=0)
