"""The broker's decisions replayed window by window with the per-GPU throughput learned
from a serving side as it goes: the closed loop the service runs, for measuring the
learner (``bench/broker_throughput.py``) and testing it.

Every window the SLO calibration takes the last window's outcome, the learner (when
on) re-learns from the last week of windows already served, starting from the rate it
learned before, and ``decide`` plans with that rate; the serving side then reports the
latency of the window at the GPUs the decision left.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tideflow.broker.calibrate import SloCalibration, scaled
from tideflow.broker.forecast import LoadForecaster, clean_outages
from tideflow.broker.load import LoadSample, ServedWindow, ServingSignal
from tideflow.broker.policy import Action, PolicyConfig, Snapshot, decide
from tideflow.broker.throughput import Served, ThroughputLearner

HISTORY_WINDOWS = 8 * 144  # the forecaster's week and a day of 10-minute windows
LEARNING_WINDOWS = 7 * 144  # the week the learner re-reads, as the service does


@dataclass(frozen=True)
class LearnedWindow:
    start_s: float
    rate: float | None  # the load served (None: a gap)
    gpus: int  # inference's GPUs after the window's decision
    latency: float | None  # what the serving side reported (None: nothing)
    estimate: float  # the per-GPU throughput the decision planned with


def replay_learning(
    raw: Sequence[LoadSample],
    configured: PolicyConfig,
    serving: Callable[[float], ServingSignal],
    slo: float,
    *,
    learn: bool,
    window_s: float = 600.0,
) -> list[LearnedWindow]:
    """Replay ``raw`` (windows of ``window_s``) from ``configured``, the serving side of
    each window given by ``serving(start_s)``; every window, gaps included."""
    seen = clean_outages(list(raw))
    learner = ThroughputLearner()
    forecaster = LoadForecaster(window_s, quantile=0.99)
    calibration, margin = SloCalibration(), 0.0
    inference, last_lend, needed_before = configured.total_gpus // 2, None, None
    estimate = configured.per_gpu_rps
    observations: list[Served] = []
    out: list[LearnedWindow] = []
    for index, sample in enumerate(seen):
        now = sample.start_s
        if needed_before is not None:
            margin = calibration.next(margin, inference >= needed_before)
        if learn:
            start = estimate if estimate != configured.per_gpu_rps else None
            estimate = learner.learn(
                observations[-LEARNING_WINDOWS:], configured.per_gpu_rps, slo, start
            ).rps
        config = replace(configured, per_gpu_rps=estimate)
        history = seen[max(0, index - HISTORY_WINDOWS) : index]
        decision = decide(
            Snapshot(
                now_s=now,
                inference_gpus=inference,
                measured_rps=seen[index - 1].rate if index else None,
                forecast=scaled(forecaster.forecast(history, now, config.lead_s), margin),
                idle_training_gpus=config.total_gpus - inference,
                last_lend_s=last_lend,
                lend_forecast=forecaster.forecast(
                    history, now, config.lend_horizon_s, config.lend_quantile
                ),
            ),
            config,
        )
        last_lend = now if decision.action == Action.LEND else last_lend
        inference = decision.inference_gpus
        rate = raw[index].rate
        (latency,) = serving(now).signals([ServedWindow(now, rate, inference)])
        observations.append(Served(rate, inference, latency))
        needed_before = math.ceil(rate / config.per_gpu_rps) if rate else None
        out.append(LearnedWindow(now, rate, inference, latency, estimate))
    return out
