"""Load sources and the forecast: trace parsing and its errors, gaps, outage cleaning,
seeded synthetic load, a Prometheus range query, and a forecast that never sees the future.

The Prometheus test serves canned `query_range` answers from a small HTTP server
on 127.0.0.1 (no Prometheus server can run here); it says so here and checks
the HTTP exchange, not Prometheus itself.
"""

from __future__ import annotations

import http.server
import json
import math
import random
import statistics
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tideflow.broker import (
    LoadForecaster,
    LoadSample,
    LoadSourceError,
    PrometheusLoad,
    SyntheticLoad,
    TraceLoad,
    clean_outages,
)
from tideflow.broker.forecast import _trailing_max


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


def test_trace_zero_and_missing_windows_are_gaps_not_zero_load(tmp_path: Path) -> None:
    trace = TraceLoad(write(tmp_path, "start_s,rate_rps\n0,10\n600,0\n1800,12.5\n2400,nan\n"))
    assert trace.window_s == 600
    assert trace.samples(0, 3000) == [
        LoadSample(0, 10.0),
        LoadSample(600, None),  # zero
        LoadSample(1200, None),  # missing row
        LoadSample(1800, 12.5),
        LoadSample(2400, None),  # NaN
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("time,rps\n0,1\n600,2\n", "trace.csv:1: header is ['time', 'rps']; expected the columns"),
        ("start_s,rate_rps\n0,1\n600,lots\n", "trace.csv:3: ['600', 'lots'] is not two numbers"),
        ("start_s,rate_rps\n0,1\n0,2\n", "trace.csv:3: start_s 0 repeated"),
        ("start_s,rate_rps\n0,1\n-600,2\n", "trace.csv:3: start_s '-600' must be a whole number"),
        ("start_s,rate_rps\n0,1\n600,2\n1500,3\n", "windows are not on one grid"),
        ("start_s,rate_rps\n0,1\n", "needs at least two windows"),
    ],
)
def test_bad_trace_is_refused_with_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(LoadSourceError, match=None) as info:
        TraceLoad(write(tmp_path, text))
    assert message in str(info.value)


def test_outage_windows_are_cleaned_using_the_past_only() -> None:
    rates = [1000.0, 1010, 990, 1005, 995, 1000, 3.0, 1002, 0.9, 998]
    cleaned = clean_outages([LoadSample(i * 600, r) for i, r in enumerate(rates)])
    assert [s.rate is None for s in cleaned] == [False] * 6 + [True, False, True, False]
    # The first windows have no past to judge by: kept as they are.
    early = clean_outages([LoadSample(0, 5.0), LoadSample(600, 1000.0)])
    assert [s.rate for s in early] == [5.0, 1000.0]


@given(
    rates=st.lists(
        st.one_of(st.none(), st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.floats(0, 1e4)),
        max_size=300,
    ),
    lookback=st.integers(6, 40),
    fraction=st.sampled_from([0.1, 0.5, 0.9]),
)
def test_outage_cleaning_judges_each_window_by_the_median_of_the_kept_windows_before_it(
    rates: list[float | None], lookback: int, fraction: float
) -> None:
    """Against the rule as stated: a window is a gap when below ``fraction`` of the median
    of the last ``lookback`` windows kept (six at least) before it."""
    kept: list[float] = []
    expected: list[float | None] = []
    for rate in rates:
        past = kept[-lookback:]
        outage = rate is not None and len(past) >= 6 and rate < fraction * statistics.median(past)
        expected.append(None if outage else rate)
        if rate is not None and not outage:
            kept.append(rate)
    samples = [LoadSample(i * 600, r) for i, r in enumerate(rates)]
    cleaned = clean_outages(samples, fraction=fraction, lookback=lookback)
    assert [s.rate for s in cleaned] == expected


def test_synthetic_load_is_seeded_and_range_independent() -> None:
    load = SyntheticLoad(mean_rps=1000, seed=7)
    whole = load.samples(0, 2 * 86400)
    assert load.samples(86400, 2 * 86400) == whole[144:]
    assert SyntheticLoad(mean_rps=1000, seed=7).samples(0, 86400) == whole[:144]
    assert SyntheticLoad(mean_rps=1000, seed=8).samples(0, 86400) != whole[:144]
    day = [s.rate for s in whole[:144] if s.rate]
    assert max(day) / min(day) > 2  # a real day/night swing


class _PrometheusAnswers(http.server.BaseHTTPRequestHandler):
    answers: list[dict[str, object]] = []
    queries: list[dict[str, list[str]]] = []

    def do_GET(self) -> None:
        self.queries.append(urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query))
        body = json.dumps(self.answers.pop(0)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[type[_PrometheusAnswers]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _PrometheusAnswers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _PrometheusAnswers.answers, _PrometheusAnswers.queries = [], []
    _PrometheusAnswers.base = f"http://127.0.0.1:{server.server_port}"  # type: ignore[attr-defined]
    try:
        yield _PrometheusAnswers
    finally:
        server.shutdown()
        server.server_close()


def test_prometheus_range_query_with_missing_and_nan_steps(
    prometheus: type[_PrometheusAnswers],
) -> None:
    prometheus.answers.append(
        {
            "status": "success",
            "data": {
                "resultType": "matrix",
                "result": [{"metric": {}, "values": [[60, "12.5"], [180, "NaN"], [240, "0"]]}],
            },
        }
    )
    load = PrometheusLoad(prometheus.base, "sum(rate(requests_total[1m]))", window_s=60)  # type: ignore[attr-defined]
    assert load.samples(60, 300) == [
        LoadSample(60, 12.5),
        LoadSample(120, None),
        LoadSample(180, None),
        LoadSample(240, None),
    ]
    (query,) = prometheus.queries
    assert query["query"] == ["sum(rate(requests_total[1m]))"] and query["step"] == ["60s"]


def test_prometheus_several_series_is_an_error_and_down_is_all_gaps(
    prometheus: type[_PrometheusAnswers],
) -> None:
    series = {"metric": {}, "values": [[60, "1"]]}
    prometheus.answers.append(
        {"status": "success", "data": {"resultType": "matrix", "result": [series, series]}}
    )
    load = PrometheusLoad(prometheus.base, "rate(x[1m])", window_s=60)  # type: ignore[attr-defined]
    with pytest.raises(LoadSourceError, match="returned 2 series; it must return one"):
        load.samples(60, 120)
    unreachable = PrometheusLoad("http://127.0.0.1:9", "up", window_s=60, timeout_s=2)
    assert unreachable.samples(0, 180) == [LoadSample(t, None) for t in (0, 60, 120)]


def test_forecast_ignores_samples_from_the_future() -> None:
    history = SyntheticLoad(mean_rps=1000, seed=3).samples(0, 3 * 86400)
    forecaster = LoadForecaster(600)
    now = 2 * 86400 + 3600
    honest = forecaster.forecast(history, now, 1800)
    tampered = [
        LoadSample(s.start_s, s.rate * 100 if s.rate and s.start_s >= now else s.rate)
        for s in history
    ]
    assert forecaster.forecast(tampered, now, 1800) == honest


def test_forecast_bounds_a_diurnal_load_and_learns_its_jumps() -> None:
    load = SyntheticLoad(mean_rps=1000, seed=4, burst_probability=0.0, outage_probability=0.0)
    history = load.samples(0, 9 * 86400)
    forecaster = LoadForecaster(600, quantile=0.99)
    covered = total = 0
    for index in range(8 * 144, 9 * 144):
        now = history[index].start_s
        bound = forecaster.forecast(history[:index], now, 600)
        assert bound.upper is not None and bound.basis == "level+seasonal"
        total += 1
        covered += bound.upper >= history[index].rate  # type: ignore[operator]
    assert covered / total >= 0.97  # a 99% bound learned from the past holds on the next day


def test_trailing_max_skips_gaps_and_matches_a_plain_max() -> None:
    rng = random.Random(5)
    values = [None if rng.random() < 0.2 else rng.uniform(0, 100) for _ in range(300)]
    for width in (1, 3, 12):
        expected = []
        for index in range(len(values)):
            seen = [v for v in values[max(0, index - width + 1) : index + 1] if v is not None]
            expected.append(max(seen) if seen else None)
        assert _trailing_max(values, width) == expected


def _series(rates: list[float]) -> list[LoadSample]:
    return [LoadSample(index * 600.0, rate) for index, rate in enumerate(rates)]


def test_forecast_learns_a_level_span_that_rides_out_short_dips() -> None:
    # Load at 1000 rps with a 30-minute dip to 500 every two hours: the highest of
    # the last three windows drops to 500 at the dip's end and load then doubles,
    # so a 3-window level needs a jump factor of 2; six windows always see 1000.
    rates = [500.0 if index % 12 in (0, 1, 2) else 1000.0 for index in range(3 * 144)]
    history = _series(rates)
    model = LoadForecaster(600, quantile=0.99).jump_model(
        dict(enumerate(rates)), len(rates), 1, 0.99
    )
    assert (model.level_windows, model.factor) == (6, 1.0)
    only_short = LoadForecaster(600, quantile=0.99, level_windows=(3,))
    assert only_short.jump_model(dict(enumerate(rates)), len(rates), 1, 0.99).factor == 2.0
    # at the end of a dip the learned span still bounds the load coming back
    dip_end = 35 * 12 + 3  # the three windows before it are the dip
    bound = LoadForecaster(600, quantile=0.99).forecast(history[:dip_end], dip_end * 600.0, 600)
    assert bound.upper == 1000 and rates[dip_end] == 1000


def test_forecast_learns_a_short_span_on_a_smooth_load() -> None:
    # A smooth daily wave: a long span's level lags the fall by hours, so the
    # tightest bound on the past week (by quantile loss) is the shortest span.
    rates = [1000 + 600 * math.sin(2 * math.pi * index / 144) for index in range(8 * 144)]
    model = LoadForecaster(600, quantile=0.99).jump_model(
        dict(enumerate(rates)), len(rates), 1, 0.99
    )
    assert model.level_windows == 3 and 1.0 <= model.factor < 1.1


def test_forecast_replays_the_same_whatever_was_asked_before() -> None:
    # The jump model is refitted every hour from the history before that hour, so a
    # fresh forecaster (a restarted service) answers exactly as a long-running one.
    history = SyntheticLoad(mean_rps=1000, seed=9).samples(0, 9 * 86400)
    running = LoadForecaster(600, quantile=0.99)
    for index in range(8 * 144, 8 * 144 + 30):
        now = history[index].start_s
        warm = running.forecast(history[:index], now, 600)
        assert LoadForecaster(600, quantile=0.99).forecast(history[:index], now, 600) == warm


def test_a_compressed_synthetic_day_is_the_same_day_faster() -> None:
    """``synthetic:MEAN@DAY_S`` (the demo's load): the same diurnal shape over a short
    day, 144 windows to a day as over a real one, and the broker's horizons and
    cooldown shortened by the same factor."""
    from tideflow.broker.policy import PolicyConfig
    from tideflow.broker.service import LoadSourceError, load_source_from, on_the_loads_clock

    real = load_source_from("synthetic:100")
    fast = load_source_from("synthetic:100@180")
    assert (real.window_s, fast.window_s) == (600.0, 1.25)
    day = [s.rate for s in real.samples(0, 86400)]
    fast_day = [s.rate for s in fast.samples(0, 180)]
    assert len(day) == len(fast_day) == 144
    peak_window = max(range(144), key=lambda i: day[i] or 0)
    fast_peak = max(range(144), key=lambda i: fast_day[i] or 0)
    assert abs(peak_window - fast_peak) <= 6  # both near 14:00 (window 84); noise aside
    config = PolicyConfig(total_gpus=16, per_gpu_rps=10.0, node_gpus=1)
    assert on_the_loads_clock(config, real) is config
    scaled = on_the_loads_clock(config, fast)
    assert scaled.lead_s == config.lead_s * 180 / 86400
    assert scaled.cooldown_s == config.cooldown_s * 180 / 86400
    assert scaled.lend_horizon_s == config.lend_horizon_s * 180 / 86400
    assert scaled.stop_cost_s == config.stop_cost_s * 180 / 86400
    for bad in ("synthetic:100@60", "synthetic:100@day", "synthetic:x"):
        with pytest.raises(LoadSourceError, match="DAY_S >= 144"):
            load_source_from(bad)


class _PrometheusRangeRules(http.server.BaseHTTPRequestHandler):
    """``/api/v1/query_range`` with the rules Prometheus applies to its parameters
    (prometheus/prometheus web/api/v1/api.go, ``queryRange``): more than 11,000 steps
    between start and end is a 400 ``bad_data``, as is a query that does not parse (here:
    one containing ``((``). A good query answers one series, value ``t / 60`` at each step.
    A model of the API's contract, not Prometheus: no Prometheus server runs here."""

    queries: list[dict[str, list[str]]] = []

    def _answer(self, code: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        self.queries.append(query)
        start, end = float(query["start"][0]), float(query["end"][0])
        step = float(query["step"][0].removesuffix("s"))
        if "heavy" in query["query"][0]:  # an execution error (api.go: errorExec -> 422)
            error = "query processing would load too many samples into memory in query execution"
            return self._answer(422, {"status": "error", "errorType": "execution", "error": error})
        if "((" in query["query"][0]:
            error = 'invalid parameter "query": 1:3: parse error: unexpected "("'
            return self._answer(400, {"status": "error", "errorType": "bad_data", "error": error})
        if (end - start) / step > 11000:
            error = (
                "exceeded maximum resolution of 11,000 points per timeseries. "
                "Try decreasing the query resolution (?step=XX)"
            )
            return self._answer(400, {"status": "error", "errorType": "bad_data", "error": error})
        values = []
        t = start
        while t <= end:
            values.append([t, str(t / 60)])
            t += step
        result = [{"metric": {}, "values": values}]
        self._answer(200, {"status": "success", "data": {"resultType": "matrix", "result": result}})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def prometheus_rules() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _PrometheusRangeRules)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _PrometheusRangeRules.queries = []
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_brokers_history_at_60s_steps_is_read_within_prometheus_resolution_limit(
    prometheus_rules: str,
) -> None:
    """The broker reads 8 days of history (``service.HISTORY_S``) at the source's step:
    11,520 steps of 60 s, over Prometheus's 11,000. Asked as one range, every window
    would be a gap, and a broker whose metric is silent never lends."""
    from tideflow.broker.service import HISTORY_S

    load = PrometheusLoad(prometheus_rules, "sum(rate(requests_total[1m]))", window_s=60)
    history = load.samples(0, HISTORY_S)
    assert len(history) == HISTORY_S // 60
    assert [s.rate for s in history] == [s.start_s / 60 or None for s in history]
    asked = _PrometheusRangeRules.queries
    assert len(asked) >= 2
    for query in asked:
        span = float(query["end"][0]) - float(query["start"][0])
        assert span / 60 <= 11000


def test_a_query_prometheus_refuses_is_an_error_not_a_silent_metric(
    prometheus_rules: str,
) -> None:
    """A 400 from Prometheus is the query's fault and stays one until someone fixes it:
    an error naming Prometheus's reason, not gaps (which would keep every GPU on
    inference, silently)."""
    load = PrometheusLoad(prometheus_rules, "sum((rate(x[1m]))", window_s=60)
    with pytest.raises(LoadSourceError, match=r"Prometheus answered .*parse error"):
        load.samples(0, 600)


def test_a_query_prometheus_fails_to_execute_is_a_gap_not_an_error(
    prometheus_rules: str,
) -> None:
    """A 422 is Prometheus failing to run a valid query now (too many samples while it is
    loaded, duplicate series during a rollout): the metric is silent for now, which the
    broker survives (it holds), rather than an error that stops it."""
    load = PrometheusLoad(prometheus_rules, "histogram_quantile(0.99, heavy)", window_s=60)
    assert load.samples(0, 180) == [LoadSample(t, None) for t in (0, 60, 120)]


def test_a_forecaster_per_step_fits_the_week_once_per_refit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The broker makes a new forecaster every step. The week's fit depends only on the
    history before its refit slot, so the six steps of one refit window fit it once (the
    old code kept the fit on the forecaster, and fitted again every step)."""
    from tideflow.broker import forecast

    fits: list[int] = []
    trailing_max = forecast._trailing_max

    def counted(values: Any, width: int) -> Any:
        fits.append(width)
        return trailing_max(values, width)

    monkeypatch.setattr(forecast, "_trailing_max", counted)
    history = SyntheticLoad(mean_rps=700, seed=11).samples(0, 9 * 86400)
    first = 8 * 144  # a refit slot (a multiple of refit_windows)
    for index in range(first, first + 6):
        LoadForecaster(600, quantile=0.97).forecast(history[:index], index * 600.0, 600)
    assert len(fits) == len(LoadForecaster(600).level_windows) + 1  # one fit
