"""The broker's settings: every ``TIDEFLOW_BROKER_*`` variable is read and checked here.

A setting the broker cannot use is a ``ConfigError`` naming the variable, its
value and what is accepted (``tideflow.config``): the CLI prints it, exits 2,
and the broker opens no state. The load and latency sources the settings name
are built here too, so that their form is checked where they are read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tideflow import settings_registry as registry
from tideflow.broker.load import (
    LoadSample,
    LoadSource,
    LoadSourceError,
    PrometheusLoad,
    PrometheusSignal,
    ServingSignal,
    SyntheticLatency,
    SyntheticLoad,
    TraceLoad,
)
from tideflow.broker.node_size import NODE_GPUS_ENV
from tideflow.config import ConfigError, env_number

BROKER_DAG_ID = "tideflow_broker"  # the Airflow DAG that runs the broker
# what the broker may move (TIDEFLOW_BROKER_DEVICE_CLASS)
DEVICE_CLASSES = registry.declared("TIDEFLOW_BROKER_DEVICE_CLASS").choices


class PeriodicTrace:
    """A trace replayed on the wall clock, repeating (t=0 of the trace is a midnight)."""

    def __init__(self, trace: TraceLoad) -> None:
        self.trace = trace
        self.window_s = trace.window_s
        self.period_s = trace.end_s - trace.start_s
        self._rates = {round(s.start_s): s.rate for s in trace.samples(trace.start_s, trace.end_s)}

    def samples(self, start_s: float, end_s: float) -> list[LoadSample]:
        step = self.window_s
        first = math.ceil(start_s / step) * step
        count = max(0, math.ceil((end_s - first) / step))
        grid = [first + i * step for i in range(count)]
        return [
            LoadSample(t, self._rates.get(round(self.trace.start_s + t % self.period_s)))
            for t in grid
        ]


def load_source_from(spec: str) -> LoadSource:
    """``trace:PATH`` (replayed on the clock), ``prometheus:URL|QUERY``, ``synthetic:RPS``."""
    kind, _, value = spec.partition(":")
    if kind == "trace" and value:
        try:
            return PeriodicTrace(TraceLoad(value))
        except (LoadSourceError, OSError, UnicodeDecodeError) as exc:  # named by its setting
            raise LoadSourceError(f"TIDEFLOW_BROKER_LOAD={spec!r}: {exc}") from None
    if kind == "prometheus" and "|" in value:
        url, _, query = value.partition("|")
        return PrometheusLoad(url, query)
    if kind == "synthetic":
        mean, _, day = value.partition("@")
        try:
            day_s, mean_rps = float(day) if day else 86400.0, float(mean or 1000)
            if math.isfinite(day_s * mean_rps) and day_s >= 144 and mean_rps > 0:
                return SyntheticLoad(mean_rps=mean_rps, day_s=day_s, window_s=day_s / 144)
        except ValueError:
            pass
    raise LoadSourceError(
        f"TIDEFLOW_BROKER_LOAD={spec!r}: use trace:PATH.csv, prometheus:URL|QUERY "
        "or synthetic:MEAN_RPS[@DAY_S] (MEAN_RPS > 0, a day of DAY_S >= 144 seconds, for demos)"
    )


LATENCY_FORMS = (
    "prometheus:URL|QUERY (the latency at the SLO's percentile, or the share of "
    "requests over the latency target, per window) or synthetic:CAPACITY_RPS (a model "
    "of the serving side whose true per-GPU throughput is CAPACITY_RPS, for demos)"
)


def latency_source_from(spec: str, window_s: float, slo_s: float) -> ServingSignal:
    """``prometheus:URL|QUERY`` or ``synthetic:CAPACITY_RPS`` (``TIDEFLOW_BROKER_LATENCY``)."""
    kind, _, value = spec.partition(":")
    if kind == "prometheus" and "|" in value:
        url, _, query = value.partition("|")
        if url and query:
            return PrometheusSignal(url, query, window_s=window_s)
    if kind == "synthetic":
        try:
            capacity = float(value)
        except ValueError:
            capacity = 0.0
        if capacity > 0 and math.isfinite(capacity) and slo_s > 0:
            return SyntheticLatency(capacity, slo_s=slo_s, window_s=window_s)
    raise LoadSourceError(
        f"TIDEFLOW_BROKER_LATENCY={spec!r}: use {LATENCY_FORMS}"
        + ("; synthetic needs TIDEFLOW_BROKER_LATENCY_SLO_S" if kind == "synthetic" else "")
    )


@dataclass(frozen=True)
class BrokerSettings:
    load: str
    per_gpu_rps: float
    # GPUs per node it moves (None: the nodes' own size, from the cluster file locally,
    # from the nodes' allocatable GPUs on a cluster; tideflow.broker.node_size)
    node_gpus: int | None = None
    device_class: str = "gpu"
    min_inference_gpus: int = 0
    grace_s: float = 300.0
    latency: str = ""  # a latency source: learn the per-GPU throughput ("" : configured)
    latency_slo_s: float = 0.0  # the source gives seconds at the SLO's percentile
    latency_slo_share: float = 0.0  # the source gives the share of requests over target
    lost_work_budget: float | None = 0.01  # share of training GPU-time stops may cost
    stop_cost_s: float = 360.0  # per GPU stopped: its checkpoint on notice and restart

    @classmethod
    def from_env(cls) -> BrokerSettings | None:
        """None when no broker is configured (TIDEFLOW_BROKER_LOAD unset); ``ConfigError``
        naming the variable, its value and what is accepted for a setting it cannot use.
        Every ``TIDEFLOW_BROKER_*`` the broker reads is read and checked here."""
        load = registry.raw("TIDEFLOW_BROKER_LOAD")
        if not load:
            return None
        load_source_from(load)  # its form (and a trace file's contents), checked now
        node = registry.raw(NODE_GPUS_ENV)
        settings = cls(
            load=load,
            per_gpu_rps=env_number(
                "TIDEFLOW_BROKER_PER_GPU_RPS",
                None,
                "a number > 0 (the requests/s one inference GPU serves within its latency SLO)",
                lambda v: v > 0,
            ),
            node_gpus=None
            if node is None
            else int(
                env_number(NODE_GPUS_ENV, None, "a whole number >= 1", _at_least(1), whole=True)
            ),
            device_class=_device_class(),
            min_inference_gpus=int(
                env_number(
                    "TIDEFLOW_BROKER_MIN_INFERENCE_GPUS",
                    "0",
                    "a whole number >= 0",
                    _at_least(0),
                    whole=True,
                )
            ),
            grace_s=env_number("TIDEFLOW_BROKER_GRACE_S", "300", "seconds >= 0", _at_least(0)),
            lost_work_budget=_lost_work_budget(),
            stop_cost_s=env_number(
                "TIDEFLOW_BROKER_STOP_COST_S", "360", "seconds >= 0", _at_least(0)
            ),
        )
        return replace(settings, **latency_settings_from_env())

    @property
    def latency_slo(self) -> float:
        return self.latency_slo_s or self.latency_slo_share


def _at_least(low: float) -> Callable[[float], bool]:
    return lambda value: value >= low


def _device_class() -> str:
    return registry.text("TIDEFLOW_BROKER_DEVICE_CLASS")


def _lost_work_budget() -> float | None:
    name = "TIDEFLOW_BROKER_LOST_WORK_BUDGET"
    if (registry.raw(name) or "").strip().lower() == "none":
        return None
    return env_number(
        name,
        "0.01",
        "a share of training GPU-time within (0, 1), e.g. 0.01, or 'none' for a fixed lend bound",
        lambda v: 0 < v < 1,
    )


def latency_settings_from_env() -> dict[str, Any]:
    """``TIDEFLOW_BROKER_LATENCY`` and its SLO (exactly one of ``_SLO_S``, ``_SLO_SHARE``)."""
    spec = registry.raw("TIDEFLOW_BROKER_LATENCY") or ""
    limits: dict[str, float] = {}
    for name, field_name in (
        ("TIDEFLOW_BROKER_LATENCY_SLO_S", "latency_slo_s"),
        ("TIDEFLOW_BROKER_LATENCY_SLO_SHARE", "latency_slo_share"),
    ):
        value = registry.optional_number(name)
        if value is not None:
            limits[field_name] = value
    if not spec:
        if limits:
            raise ConfigError(
                " and ".join(f"TIDEFLOW_BROKER_{n.upper()}" for n in limits)
                + f" set without TIDEFLOW_BROKER_LATENCY ({LATENCY_FORMS})"
            )
        return {}
    if len(limits) != 1:
        raise ConfigError(
            f"TIDEFLOW_BROKER_LATENCY={spec!r} needs exactly one "
            "of TIDEFLOW_BROKER_LATENCY_SLO_S (the source gives the latency in seconds at "
            "the SLO's percentile) or TIDEFLOW_BROKER_LATENCY_SLO_SHARE (the source gives "
            "the share of requests over the latency target)"
        )
    latency_source_from(spec, 60.0, limits.get("latency_slo_s", 0.0))  # its form, checked now
    return {"latency": spec, **limits}
