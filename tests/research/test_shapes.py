"""The load shapes laid over a trace for benchmarks (weekly, holiday, step, drift)."""

from __future__ import annotations

import pytest

from research.broker.shapes import ShapedLoad
from tideflow.broker.load import LoadSample

pytestmark = pytest.mark.research

DAY = 86400.0


class _Flat:
    window_s = 600.0
    start_s = 0.0
    end_s = 14 * DAY

    def samples(self, start_s: float, end_s: float) -> list[LoadSample]:
        return [
            LoadSample(t, None if t == 600.0 else 100.0)
            for t in (600.0 * i for i in range(int(start_s // 600), int(end_s // 600)))
        ]


@pytest.mark.parametrize(
    ("shape", "at_day", "factor"),
    [
        ("weekly", 5.5, 0.6),
        ("weekly", 7.5, 1.0),
        ("holiday", 9.5, 0.35),
        ("holiday", 10.5, 1.0),
        ("step", 7.9, 1.0),
        ("step", 8.1, 1.5),
        ("drift", 7.0, 1.3),
    ],
)
def test_shapes_multiply_the_base_load(shape: str, at_day: float, factor: float) -> None:
    shaped = ShapedLoad(_Flat(), shape)
    t = round(at_day * DAY / 600) * 600
    (sample,) = shaped.samples(t, t + 600)
    assert sample.rate == pytest.approx(100.0 * factor, rel=0.01)
    assert shaped.samples(600.0, 1200.0)[0].rate is None  # a gap stays a gap
