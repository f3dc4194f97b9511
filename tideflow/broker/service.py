"""One broker step (observe -> forecast -> decide -> act -> record), and its settings.

The Airflow ``RebalanceOperator``, the ``InferenceLoadSensor``'s trigger and
``tideflow broker run`` all call these functions: the same policy, the same
code, wherever the broker runs.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, replace
from itertools import pairwise
from pathlib import Path
from typing import Any, Protocol

from tideflow.broker.calibrate import SloCalibration, scaled
from tideflow.broker.forecast import LoadForecaster, clean_outages
from tideflow.broker.journal import DecisionJournal, JournalEntry
from tideflow.broker.load import (
    LoadSample,
    LoadSource,
    LoadSourceError,
    PrometheusLoad,
    SyntheticLoad,
    TraceLoad,
)
from tideflow.broker.local import LocalActuator
from tideflow.broker.policy import Decision, GangView, PolicyConfig, Snapshot, decide


class Actuator(Protocol):
    """What a broker step needs from where it acts (the local ledger, a cluster)."""

    def total_gpus(self) -> int: ...
    def inference_gpus(self) -> int: ...
    def idle_training_gpus(self) -> int: ...
    def gangs(self) -> tuple[GangView, ...]: ...
    def apply(self, decision: Decision) -> Any: ...


class TenantActuator(Actuator, Protocol):
    """An actuator that may act as inference's tenant of the cluster file's teams."""

    @property
    def tenant(self) -> bool: ...
    def capacity(self) -> int: ...
    def least_gpus(self) -> int: ...


BROKER_DAG_ID = "tideflow_broker"  # the Airflow DAG that runs the broker
HISTORY_S = 8 * 86400.0
CALIBRATION_S = 7 * 86400.0  # outcomes the SLO calibration replays


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
        return PeriodicTrace(TraceLoad(value))
    if kind == "prometheus" and "|" in value:
        url, _, query = value.partition("|")
        return PrometheusLoad(url, query)
    if kind == "synthetic":
        mean, _, day = value.partition("@")
        try:
            day_s = float(day) if day else 86400.0
            if day_s >= 144:
                return SyntheticLoad(
                    mean_rps=float(mean or 1000), day_s=day_s, window_s=day_s / 144
                )
        except ValueError:
            pass
    raise LoadSourceError(
        f"TIDEFLOW_BROKER_LOAD={spec!r}: use trace:PATH.csv, prometheus:URL|QUERY "
        "or synthetic:MEAN_RPS[@DAY_S] (a day of DAY_S >= 144 seconds, for demos)"
    )


def day_scale(load: LoadSource) -> float:
    """How much shorter the load's day is than a real one (1: a real day)."""
    return float(getattr(load, "day_s", 86400.0)) / 86400.0


def on_the_loads_clock(config: PolicyConfig, load: LoadSource) -> PolicyConfig:
    """The policy's horizons and cooldown shortened with a compressed day, so a demo's
    broker forecasts, lends and waits as it would over a real one."""
    scale = day_scale(load)
    if scale == 1.0:
        return config
    return replace(
        config,
        lead_s=config.lead_s * scale,
        lend_horizon_s=config.lend_horizon_s * scale,
        cooldown_s=config.cooldown_s * scale,
    )


@dataclass(frozen=True)
class BrokerSettings:
    load: str
    per_gpu_rps: float
    node_gpus: int = 8
    device_class: str = "gpu"
    min_inference_gpus: int = 0
    grace_s: float = 300.0

    @classmethod
    def from_env(cls) -> BrokerSettings | None:
        """None when no broker is configured (TIDEFLOW_BROKER_LOAD unset)."""
        load = os.environ.get("TIDEFLOW_BROKER_LOAD")
        if not load:
            return None
        values: dict[str, str] = {}
        try:
            for name, default in (
                ("PER_GPU_RPS", ""),
                ("NODE_GPUS", "8"),
                ("MIN_INFERENCE_GPUS", "0"),
                ("GRACE_S", "300"),
            ):
                values[name] = os.environ.get(f"TIDEFLOW_BROKER_{name}", default)
            settings = cls(
                load=load,
                per_gpu_rps=float(values["PER_GPU_RPS"] or 0),
                node_gpus=int(values["NODE_GPUS"]),
                device_class=os.environ.get("TIDEFLOW_BROKER_DEVICE_CLASS", "gpu"),
                min_inference_gpus=int(values["MIN_INFERENCE_GPUS"]),
                grace_s=float(values["GRACE_S"]),
            )
        except ValueError:
            raise ValueError(
                f"tideflow broker settings: TIDEFLOW_BROKER_* must be numbers (got {values})"
            ) from None
        if settings.per_gpu_rps <= 0:
            raise ValueError(
                "tideflow broker settings: TIDEFLOW_BROKER_PER_GPU_RPS must be > 0 "
                "(requests/s one inference GPU serves within its latency SLO)"
            )
        return settings


def policy_config(settings: BrokerSettings, total_gpus: int) -> PolicyConfig:
    return PolicyConfig(
        total_gpus=total_gpus,
        per_gpu_rps=settings.per_gpu_rps,
        node_gpus=settings.node_gpus,
        min_inference_gpus=settings.min_inference_gpus,
        headroom=0.05,
        lead_s=600.0,
        checkpoint_grace_s=settings.grace_s,
    )


def coverage(entries: list[JournalEntry], window_s: float) -> list[bool]:
    """Per load window, oldest first: did the inference GPUs held cover the load measured?

    Each decision records the need measured over the window before it; the
    GPUs held then are those the previous decision left. Decisions are more
    frequent than load windows, so one outcome per window (its last decision).
    """
    outcomes: dict[int, bool] = {}
    for before, entry in pairwise(entries):
        if entry.needed is not None:
            outcomes[int(entry.at_s // window_s)] = before.inference_gpus >= entry.needed
    return [outcomes[k] for k in sorted(outcomes)]


def observe(
    load: LoadSource,
    actuator: Actuator,
    config: PolicyConfig,
    journal: DecisionJournal,
    now_s: float,
) -> Snapshot:
    """Everything the policy needs, read now; the load from before ``now`` only."""
    scale = day_scale(load)
    history = clean_outages(load.samples(now_s - HISTORY_S * scale, now_s))
    forecaster = LoadForecaster(load.window_s, quantile=0.99)
    last = history[-1].rate if history else None
    outcomes = coverage(journal.since(now_s - CALIBRATION_S * scale), load.window_s)
    margin = SloCalibration().replay(outcomes)
    return Snapshot(
        now_s=now_s,
        inference_gpus=actuator.inference_gpus(),
        measured_rps=last,
        forecast=scaled(forecaster.forecast(history, now_s, config.lead_s), margin),
        idle_training_gpus=actuator.idle_training_gpus(),
        gangs=actuator.gangs(),
        last_lend_s=journal.last_lend_s(),
        lend_forecast=forecaster.forecast(
            history, now_s, config.lend_horizon_s, config.lend_quantile
        ),
    )


def peek(
    load: LoadSource,
    actuator: Actuator,
    config: PolicyConfig,
    journal: DecisionJournal,
    now_s: float | None = None,
) -> Decision:
    """What the broker would decide now, without acting or recording (for sensors)."""
    now = time.time() if now_s is None else now_s
    return decide(observe(load, actuator, config, journal, now), config)


def within_inference_quota(
    config: PolicyConfig, actuator: TenantActuator, settings: BrokerSettings
) -> PolicyConfig:
    """The policy's bounds when the broker is inference's tenant (``tideflow.broker.tenant``).

    The decision then moves within inference's declared nominal quota in whole nodes,
    and never below what the actuator keeps anyway (``least_gpus``: on a cluster, the
    part of the quota inference's rules let nobody borrow), so that the journal records
    what is held rather than a number the actuator would correct.
    """
    if not actuator.tenant:
        return config
    node = settings.node_gpus
    most = actuator.capacity() // node * node
    if most < settings.min_inference_gpus:
        raise ValueError(
            f"tideflow broker: team inference's {settings.device_class} quota in the "
            f"cluster file holds {most} GPU(s) in whole nodes of {node}, below the "
            f"broker's min_inference_gpus {settings.min_inference_gpus}"
        )
    least = min(most, -(-actuator.least_gpus() // node) * node)
    return replace(
        config,
        max_inference_gpus=most,
        min_inference_gpus=max(config.min_inference_gpus, least),
    )


def open_local(
    settings: BrokerSettings, ledger_path: Path, journal_path: Path, cluster_file: str | None
) -> tuple[LoadSource, LocalActuator, PolicyConfig, DecisionJournal]:
    """The pieces of a local broker, from its settings and the shared state files."""
    from tideflow.backends.local import LocalBackend
    from tideflow.gangs import open_ledger

    ledger = open_ledger(ledger_path, cluster_file)
    backend = LocalBackend(ledger_path.parent / "gangs")
    actuator = LocalActuator(
        ledger,
        backend,
        node_gpus=settings.node_gpus,
        device_class=settings.device_class,
        grace_s=settings.grace_s,
        checkpoint_store=backend.checkpoint_store,
    )
    total = actuator.total_gpus()
    if total == 0:
        raise ValueError(
            f"tideflow broker: the inventory has no {settings.device_class} devices "
            "(set TIDEFLOW_CLUSTER_FILE to a cluster that has them)"
        )
    load = load_source_from(settings.load)
    config = on_the_loads_clock(policy_config(settings, total), load)
    config = within_inference_quota(config, actuator, settings)
    return load, actuator, config, DecisionJournal(journal_path)


def open_kubernetes(
    settings: BrokerSettings, journal_path: Path, api_client: Any
) -> tuple[LoadSource, Any, PolicyConfig, DecisionJournal]:
    """The pieces of a broker acting on a cluster (``tideflow.broker.kubernetes``), the
    objects it moves named by ``TIDEFLOW_K8S_*`` and its teams by ``TIDEFLOW_CLUSTER_FILE``."""
    from tideflow.broker.kubernetes import KubernetesActuator, target_from_env

    actuator = KubernetesActuator(api_client, target_from_env(), grace_s=settings.grace_s)
    load = load_source_from(settings.load)
    config = on_the_loads_clock(policy_config(settings, actuator.total_gpus()), load)
    config = within_inference_quota(config, actuator, settings)
    return load, actuator, config, DecisionJournal(journal_path)


def rebalance_once(
    load: LoadSource,
    actuator: Actuator,
    config: PolicyConfig,
    journal: DecisionJournal,
    now_s: float | None = None,
    *,
    act: bool = True,
) -> tuple[Decision, Any]:
    now = time.time() if now_s is None else now_s
    snapshot = observe(load, actuator, config, journal, now)
    decision = decide(snapshot, config)
    applied = actuator.apply(decision) if act else None
    journal.record(
        now,
        decision,
        total_gpus=config.total_gpus,
        measured_rps=snapshot.measured_rps,
        forecast_upper=snapshot.forecast.upper,
        applied=applied.note if applied else "",
    )
    return decision, applied
