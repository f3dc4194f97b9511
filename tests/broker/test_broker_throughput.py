"""The broker learns its per-GPU throughput from the serving side's latency.

No serving system runs here, so the serving side is a model
(``tideflow.broker.load.SyntheticLatency``): each GPU a queue whose latency at
the SLO's percentile grows as 1 / (service rate - per-GPU rate), equal to the
SLO exactly at a true per-GPU capacity, with seeded log-normal noise per
window (about +-5% of the capacity at two sigma). It is replayed over the
seeded synthetic diurnal load (with outage windows) with the broker's real
forecaster, SLO calibration and ``decide`` every window; the learner sees
only the windows already served, as the service does. The Prometheus latency
source is read from the canned ``query_range`` answers of
``tests/broker/test_broker_load.py``'s small HTTP server (no Prometheus runs here).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.broker.test_broker_load import _PrometheusAnswers, prometheus
from tests.fakes import WindowedLoad
from tideflow.broker.journal import DecisionJournal, DecisionRecord
from tideflow.broker.load import (
    LoadSourceError,
    PrometheusSignal,
    ServedWindow,
    SyntheticLoad,
)
from tideflow.broker.local import LocalActuator
from tideflow.broker.policy import PolicyConfig
from tideflow.broker.service import (
    BrokerSettings,
    ServedLoad,
    learned_throughput,
    rebalance_once,
    served,
    served_windows,
)
from tideflow.broker.throughput import Served, ThroughputLearner, recorded
from tideflow.inventory import Inventory, Node
from tideflow.scheduling import LeaseLedger

__all__ = ["prometheus"]  # the fixture shared with the load source tests

TRUE_RPS = 25.0  # the model's per-GPU capacity at the latency SLO
SLO_S = 1.0
DAY = 144  # 10-minute windows
LEARNER = ThroughputLearner()


def windows(per_gpu_rates: list[float], limit_rps: float, gpus: int = 10) -> list[Served]:
    """Windows served at the given per-GPU rates, breaking the SLO above ``limit_rps``."""
    return [Served(x * gpus, gpus, 2.0 if x > limit_rps else 0.5) for x in per_gpu_rates]


def test_outages_and_missing_latency_teach_nothing() -> None:
    history = windows([20.0] * 40 + [22.0, 23.0, 24.0], limit_rps=21.0)
    gaps = [Served(None, 10, 0.5), Served(0.0, 10, 9.0), Served(200.0, 10, None)]
    with_gaps = [w for window in history for w in (window, *gaps)]
    plain = LEARNER.learn(history, 30.0, SLO_S)
    assert plain.rps < 30.0
    assert LEARNER.learn(with_gaps, 30.0, SLO_S) == plain
    silent = LEARNER.learn(gaps * 100, 30.0, SLO_S)
    assert (silent.rps, silent.windows) == (30.0, 0)
    assert "0 of 36 windows" in silent.reason


def test_the_configured_rate_holds_until_enough_windows_were_seen() -> None:
    early = windows([20.0] * 10 + [25.0] * 10, limit_rps=21.0)
    assert LEARNER.learn(early, 30.0, SLO_S).rps == 30.0
    late = windows([20.0] * 30 + [25.0] * 10, limit_rps=21.0)
    assert LEARNER.learn(late, 30.0, SLO_S).rps == pytest.approx(0.95 * 25.0)


def test_one_noisy_window_moves_nothing_but_evidence_does() -> None:
    """A single breach at a low rate (noise) does not lower the estimate, a second one
    does; a single lucky window above it does not raise it, a second one does."""
    steady = [Served(200.0, 10, 0.5)] * 40
    one_breach = [*steady, Served(100.0, 10, 3.0)]
    assert LEARNER.learn(one_breach, 25.0, SLO_S).rps == 25.0
    two = LEARNER.learn([*one_breach, Served(150.0, 10, 3.0)], 25.0, SLO_S)
    assert two.rps == pytest.approx(0.95 * 15.0)
    assert two.reason == "per-GPU throughput learned 14.25 rps from 42 windows (was 25 configured)"
    one_hold = [*steady, Served(300.0, 10, 0.5)]
    assert LEARNER.learn(one_hold, 25.0, SLO_S).rps == 25.0
    rose = LEARNER.learn([*one_hold, Served(280.0, 10, 0.5)], 25.0, SLO_S)
    assert rose.rps == 28.0  # the lower of the two holds: the higher may be noise
    never_above = LEARNER.learn([*steady] * 10, 25.0, SLO_S)
    assert never_above.rps == 25.0  # nothing broke, nothing held above: no rise


def test_a_share_over_target_is_a_signal_like_latency() -> None:
    """The serving side may report the share of requests over the latency target; the
    SLO then allows a share (here 1%) and 0 is a value, not a gap."""
    shares = [Served(200.0, 10, 0.0)] * 40 + [Served(230.0, 10, 0.05)] * 2
    learned = LEARNER.learn(shares, 25.0, 0.01)
    assert learned.rps == pytest.approx(0.95 * 23.0)
    assert learned.windows == 42


def lab(tmp_path: Path, gpus: int) -> LocalActuator:
    nodes = tuple(Node(f"n{i}", 8, "gpu", "T4", 1) for i in range(gpus))
    ledger = LeaseLedger(tmp_path / "leases.db", Inventory("lab", nodes, declared=True))
    return LocalActuator(ledger, None, node_gpus=1)


def test_the_service_learns_from_its_journal_and_says_so(tmp_path: Path) -> None:
    """The local broker with a latency source (the serving model at 10 rps per GPU) and
    30 rps per GPU configured: the journal's reasons name the learned throughput, and
    inference grows past what the configured rate asked for."""
    settings = BrokerSettings(
        load="synthetic:100",
        per_gpu_rps=30.0,
        node_gpus=1,
        latency="synthetic:10",
        latency_slo_s=1.0,
    )
    plain = SyntheticLoad(mean_rps=100.0)
    load = served(settings, plain)
    assert isinstance(load, ServedLoad)
    actuator = lab(tmp_path, 24)
    journal = DecisionJournal(tmp_path / "broker.db")
    config = PolicyConfig(
        total_gpus=24,
        per_gpu_rps=30.0,
        node_gpus=1,
        headroom=0.05,
        min_inference_gpus=1,
        lead_s=600.0,
    )
    most = 0
    for step in range(2 * DAY):
        decision, _ = rebalance_once(load, actuator, config, journal, now_s=step * 600.0 + 1)
        most = max(most, decision.inference_gpus)
    last = journal.last()
    assert last is not None
    assert "per-GPU throughput learned" in last.reason
    assert "(was 30 configured)" in last.reason
    learned = learned_throughput(load, config, journal, 2 * DAY * 600.0 + 1)
    assert learned is not None and learned.rps <= 1.15 * 10.0  # down from 30, near 10
    assert most >= 150 / learned.rps  # the day's peak served at the learned rate
    # Without a latency source the broker is as it was: the load itself, no note.
    assert served(replace(settings, latency="", latency_slo_s=0.0), plain) is plain
    assert learned_throughput(plain, config, journal, 0.0) is None
    with pytest.raises(ValueError, match="needs exactly one of latency_slo_s"):
        served(replace(settings, latency_slo_s=0.0), plain)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TIDEFLOW_BROKER_LATENCY": "prometheus:http://p|q"}, "needs exactly one of"),
        (
            {
                "TIDEFLOW_BROKER_LATENCY": "prometheus:http://p|q",
                "TIDEFLOW_BROKER_LATENCY_SLO_S": "-1",
            },
            "TIDEFLOW_BROKER_LATENCY_SLO_S='-1': accepted: seconds > 0",
        ),
        (
            {
                "TIDEFLOW_BROKER_LATENCY": "prometheus:http://p|q",
                "TIDEFLOW_BROKER_LATENCY_SLO_SHARE": "5",
            },
            r"TIDEFLOW_BROKER_LATENCY_SLO_SHARE='5': accepted: a share within \(0, 1\)",
        ),
        ({"TIDEFLOW_BROKER_LATENCY_SLO_S": "0.5"}, "set without TIDEFLOW_BROKER_LATENCY"),
        (
            {"TIDEFLOW_BROKER_LATENCY": "grafana:x", "TIDEFLOW_BROKER_LATENCY_SLO_S": "0.5"},
            r"TIDEFLOW_BROKER_LATENCY='grafana:x': use prometheus:URL\|QUERY",
        ),
        (
            {
                "TIDEFLOW_BROKER_LATENCY": "synthetic:10",
                "TIDEFLOW_BROKER_LATENCY_SLO_SHARE": "0.01",
            },
            "synthetic needs TIDEFLOW_BROKER_LATENCY_SLO_S",
        ),
    ],
)
def test_latency_settings_are_checked_with_the_variable_named(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    monkeypatch.setenv("TIDEFLOW_BROKER_LOAD", "synthetic:100")
    monkeypatch.setenv("TIDEFLOW_BROKER_PER_GPU_RPS", "25")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises((ValueError, LoadSourceError), match=message):
        BrokerSettings.from_env()


def test_latency_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEFLOW_BROKER_LOAD", "synthetic:100")
    monkeypatch.setenv("TIDEFLOW_BROKER_PER_GPU_RPS", "25")
    settings = BrokerSettings.from_env()
    assert settings is not None and settings.latency == ""
    monkeypatch.setenv("TIDEFLOW_BROKER_LATENCY", "prometheus:http://prom:9090|p99")
    monkeypatch.setenv("TIDEFLOW_BROKER_LATENCY_SLO_SHARE", "0.01")
    settings = BrokerSettings.from_env()
    assert settings is not None
    assert (settings.latency, settings.latency_slo) == ("prometheus:http://prom:9090|p99", 0.01)


def test_what_was_learned_outlives_the_history_it_was_learned_from() -> None:
    """The service replays a week from the rate its journal last recorded: a week served
    without breaches below the learned rate does not bring back the configured one (that
    would be learning upward from the absence of breaches)."""
    quiet_week = windows([15.0] * 1008, limit_rps=21.0)
    assert LEARNER.learn(quiet_week, 30.0, SLO_S).rps == 30.0  # from nothing: configured
    kept = LEARNER.learn(quiet_week, 30.0, SLO_S, start=19.95)
    assert kept.rps == 19.95
    assert recorded(kept.reason, 30.0) == 19.95
    assert recorded(kept.reason, 40.0) is None  # a new configured rate starts afresh
    assert recorded("per-GPU throughput 30 rps as configured: 3 of 36 windows", 30.0) is None


STEPS = WindowedLoad(100.0)  # a load of fixed windows, for the GPUs-per-window join


def decided(at_s: float, gpus: int) -> DecisionRecord:
    return DecisionRecord(at_s, "hold", gpus, 16, 100.0, 100.0, 4, 4, False, (), "", "")


def test_a_window_counts_only_when_inference_held_the_same_gpus_through_it() -> None:
    """Decisions come every 5 minutes, windows last 10: a window whose GPUs changed within
    it teaches nothing (its latency mixes two allocations); before the first decision,
    nothing; the window still running is left out."""
    entries = [decided(300, 4), decided(900, 8), decided(1500, 6), decided(2100, 6)]
    assert served_windows(STEPS, entries, 0.0, 2500.0) == [
        ServedWindow(0.0, 100.0, 0),  # nothing journaled before 300 s: inference unknown
        ServedWindow(600.0, 100.0, 0),  # 4 from 300 s, then 8 from 900 s
        ServedWindow(1200.0, 100.0, 0),  # 8, then 6 from 1500 s
        ServedWindow(1800.0, 100.0, 6),  # the window from 2400 s still runs: left out
    ]
    # Settled: the GPUs must also have been held this long before the window.
    entries = [decided(0, 4), decided(300, 4), decided(900, 8), decided(1500, 8)]
    assert [w.gpus for w in served_windows(STEPS, entries, 0.0, 3000.0, 600.0)] == [
        0,  # nothing journaled 600 s before it
        0,  # 4, then 8 from 900 s
        0,  # 8 since 900 s, but 4 within the 600 s before it
        8,
        8,
    ]


class _LaggingLatency:
    """A p99 over the last 10 minutes (the docstring's example query), served at 60 s
    steps: it breaks while any minute of the ten was over the true capacity."""

    def __init__(self, gpus_at: Any, rate: float, capacity: float) -> None:
        self.gpus_at, self.rate, self.capacity = gpus_at, rate, capacity

    def __call__(self, t: float) -> float:
        minutes = [s for s in range(int(t) - 540, int(t) + 60, 60) if s >= 0]
        return 1.5 if any(self.rate / self.gpus_at(s) > self.capacity for s in minutes) else 0.6


def test_breaches_from_before_a_grow_are_not_charged_to_the_gpus_after_it() -> None:
    """The broker grows 16 -> 24 GPUs when latency breaks; a latency signal over the last
    10 minutes keeps breaking for 10 minutes after, at a per-GPU rate (7.5) below the
    true capacity (10). Those windows must not teach that capacity is 7.5."""

    def gpus_at(t: float) -> int:
        return 16 if t < 600 else 24

    latency = _LaggingLatency(gpus_at, 180.0, 10.0)
    entries = [decided(t, gpus_at(t)) for t in range(0, 3600, 60)]
    windows = served_windows(WindowedLoad(180.0, 60.0), entries, 0.0, 3600.0, 900.0)
    observations = [Served(w.rate, w.gpus, latency(w.start_s)) for w in windows]
    learned = ThroughputLearner().learn(observations, 10.0, 1.0, start=10.0)
    assert learned.rps >= 10.0


def test_latency_from_prometheus_keeps_zero_and_drops_nan(
    prometheus: type[_PrometheusAnswers],
) -> None:
    """The share over target is often exactly 0: a value, not a gap; NaN and missing
    steps are gaps."""
    prometheus.answers.append(
        {
            "status": "success",
            "data": {
                "resultType": "matrix",
                "result": [{"metric": {}, "values": [[60, "0.8"], [120, "0"], [180, "NaN"]]}],
            },
        }
    )
    signal = PrometheusSignal(prometheus.base, "p99_latency", window_s=60)  # type: ignore[attr-defined]
    windows = [ServedWindow(t, 50.0, 4) for t in (60.0, 120.0, 180.0, 240.0)]
    assert signal.signals(windows) == [0.8, 0.0, None, None]
    (query,) = prometheus.queries
    assert query["query"] == ["p99_latency"] and query["step"] == ["60s"]
