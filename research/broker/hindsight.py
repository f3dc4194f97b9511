"""A forecast fitted in hindsight: how far a better forecast of the next window could go.

The oracle knows each window's load, so the share of its gain that tidal
captures mixes two things: what no forecast from the past can know, and what
tidal's own forecast (a recent level times the jumps seen before) leaves on
the table. To tell them apart, this module fits a richer forecast to the very
trace it is then scored on: a linear quantile regression of the next window's
log load on what is known before it (the last three windows, the highest of
the last six, the mean of the last twelve, the same window yesterday and a
week ago where they exist, and the time of day). Fitted on the windows it
predicts, it is an optimistic reference for forecasts of that kind: a causal
forecast of the same form can only do worse. ``cross_fitted`` is the fairer
variant: each window is predicted by a fit to the other half of the trace
(its own half left out), as a forecast learned on other days would be.

The regression is scikit-learn's ``QuantileRegressor`` (an exact linear
programme); nothing here is a policy the broker runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tideflow.broker.load import LoadSample

DAY_WINDOWS = 144  # 10-minute windows; the trace's own window is passed in
FEATURES = (
    "last",
    "second last",
    "third last",
    "highest of 6",
    "mean of 12",
    "yesterday",
    "has yesterday",
    "a week ago",
    "has a week ago",
    "time of day (sin)",
    "time of day (cos)",
    "half day (sin)",
    "half day (cos)",
)


def features(samples: Sequence[LoadSample], window_s: float) -> list[list[float] | None]:
    """For each window, what is known at its start (None: too early, nothing seen yet).

    Loads are logged; a gap (None) is filled with the last load seen before it, so a
    lag that falls on an outage reads the load the broker last saw.
    """
    day = round(86400.0 / window_s)
    week = 7 * day
    filled: list[float | None] = []
    last: float | None = None
    for sample in samples:
        if sample.rate is not None and sample.rate > 0:
            last = math.log(sample.rate)
        filled.append(last)
    out: list[list[float] | None] = []
    for index, sample in enumerate(samples):
        if index < 12 or filled[index - 12] is None:
            out.append(None)
            continue
        recent = [x for x in filled[index - 12 : index] if x is not None]
        lag1, lag2, lag3 = filled[index - 1], filled[index - 2], filled[index - 3]
        yesterday = filled[index - day] if index >= day else None
        week_ago = filled[index - week] if index >= week else None
        phase = 2 * math.pi * (sample.start_s % 86400.0) / 86400.0
        out.append(
            [
                lag1 or 0.0,
                lag2 or 0.0,
                lag3 or 0.0,
                max(recent[-6:]),
                sum(recent) / len(recent),
                yesterday if yesterday is not None else lag1 or 0.0,
                float(yesterday is not None),
                week_ago if week_ago is not None else lag1 or 0.0,
                float(week_ago is not None),
                math.sin(phase),
                math.cos(phase),
                math.sin(2 * phase),
                math.cos(2 * phase),
            ]
        )
    return out


def _fit_predict(
    rows: list[list[float] | None],
    targets: list[float | None],
    fit_on: Sequence[int],
    predict: Sequence[int],
    quantile: float,
) -> dict[int, float]:
    from sklearn.linear_model import QuantileRegressor

    train = [i for i in fit_on if rows[i] is not None and targets[i] is not None]
    wanted = [i for i in predict if rows[i] is not None]
    if len(train) <= len(FEATURES) or not wanted:
        return {}
    model = QuantileRegressor(quantile=quantile, alpha=0.0, solver="highs")
    model.fit([rows[i] for i in train], [math.log(targets[i]) for i in train])  # type: ignore[arg-type]
    predicted = model.predict([rows[i] for i in wanted])
    return {i: math.exp(float(p)) for i, p in zip(wanted, predicted, strict=True)}


def hindsight_bounds(
    samples: Sequence[LoadSample],
    window_s: float,
    quantile: float,
    *,
    cross_fitted: bool = False,
) -> list[float | None]:
    """Each window's bound on its load at ``quantile``, fitted on the trace itself (or,
    ``cross_fitted``, on the half of the trace the window is not in); None where nothing
    is known yet (the first two hours)."""
    if not 0 < quantile < 1:
        raise ValueError(f"quantile must be within (0, 1) (got {quantile})")
    rows = features(samples, window_s)
    targets = [s.rate if s.rate is not None and s.rate > 0 else None for s in samples]
    everything = range(len(samples))
    if cross_fitted:
        half = len(samples) // 2
        first, second = range(half), range(half, len(samples))
        bounds = _fit_predict(rows, targets, second, first, quantile)
        bounds |= _fit_predict(rows, targets, first, second, quantile)
    else:
        bounds = _fit_predict(rows, targets, everything, everything, quantile)
    return [bounds.get(i) for i in everything]
