"""The broker in Airflow: a deferrable load sensor, the rebalance step, and a capacity
sensor that training pipelines put before their gang step.

All three run the core broker code (``tideflow.broker.service``) against the
state shared with the gang operators: the lease ledger and the decision
journal under ``TIDEFLOW_HOME``. The broker is configured by environment
(``TIDEFLOW_BROKER_*``), never by a pipeline file.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, BaseSensorOperator, Context
from airflow.sdk.exceptions import AirflowException, AirflowSkipException

from tideflow import settings_registry as registry
from tideflow.operators.broker_triggers import BrokerDecisionTrigger, CapacityTrigger
from tideflow.operators.hook import TideflowHook
from tideflow.operators.settings_check import check_settings_at_start, settings_fail_the_task
from tideflow.operators.trigger_base import TriggerStatus

if TYPE_CHECKING:
    from tideflow.gangs import GangRequestJson
    from tideflow.scheduling.model import DeviceClass


def _state() -> tuple[dict[str, Any], str, str, str | None]:
    from dataclasses import asdict

    from tideflow.broker.settings import BrokerSettings

    with settings_fail_the_task():  # a setting it cannot use: one message, final
        registry.check_set("broker")
        settings = BrokerSettings.from_env()
        paths = TideflowHook().settings()
    if settings is None:
        raise AirflowException(
            "tideflow broker: TIDEFLOW_BROKER_LOAD is not set (trace:PATH.csv, "
            "prometheus:URL|QUERY or synthetic:MEAN_RPS)"
        )
    return asdict(settings), str(paths.ledger_path), str(paths.broker_journal_path), paths.cluster


class InferenceLoadSensor(BaseSensorOperator):
    """Waits (deferred) until the measured or forecast load asks the broker to act.

    Succeeds with the pending decision; skips its downstream when the load stays
    within the thresholds until ``timeout``.
    """

    ui_color = "#fdebd0"

    def __init__(self, *, deferrable: bool = True, poll_s: float = 30.0, **kwargs: Any) -> None:
        kwargs.setdefault("timeout", 240)
        kwargs.setdefault("poke_interval", poll_s)
        super().__init__(**kwargs)
        self.deferrable = deferrable
        self.poll_s = poll_s

    def poke(self, context: Context) -> bool:
        settings, ledger, journal, cluster = _state()
        event = BrokerDecisionTrigger.decide_now(settings, ledger, journal, cluster)
        if event["action"] != "hold":
            context["ti"].xcom_push(key="decision", value=event)
            return True
        return False

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        settings, ledger, journal, cluster = _state()
        self.defer(
            trigger=BrokerDecisionTrigger(
                settings=settings,
                ledger_path=ledger,
                journal_path=journal,
                cluster_file=cluster,
                deadline=time.time() + float(self.timeout),
                poll_s=self.poll_s,
            ),
            method_name="load_changed",
        )

    def load_changed(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        if event["status"] != TriggerStatus.ACT:
            raise AirflowSkipException(f"tideflow broker: nothing to do ({event['reason']})")
        self.log.info("tideflow broker: %s: %s", event["action"], event["reason"])
        return event


class RebalanceOperator(BaseOperator):
    """Takes one broker step: observe, decide, act (checkpoint-before-evict), record."""

    ui_color = "#fad7a0"

    def execute(self, context: Context) -> dict[str, Any]:
        from pathlib import Path

        from tideflow.broker.service import open_local, rebalance_once
        from tideflow.broker.settings import BrokerSettings

        settings, ledger, journal, cluster = _state()
        load, actuator, config, book = open_local(
            BrokerSettings(**settings), Path(ledger), Path(journal), cluster
        )
        decision, applied = rebalance_once(load, actuator, config, book)
        self.log.info(
            "tideflow broker: %s -> %d inference GPUs: %s",
            decision.action,
            decision.inference_gpus,
            decision.reason,
        )
        if applied is not None:
            self.log.info("tideflow broker: applied: %s", applied.note)
            if applied.forced:
                self.log.warning("tideflow broker: forced after the grace: %s", applied.forced)
        return {
            "action": str(decision.action),
            "inference_gpus": applied.inference_gpus if applied else decision.inference_gpus,
            "reason": decision.reason,
            "preempted": list(applied.preempted) if applied else [],
            "complete": bool(applied.complete) if applied else False,
        }


class GpuCapacitySensor(BaseSensorOperator):
    """Waits (deferred) until the broker has left room for a gang of this size.

    Put it before a gang step to start training only when capacity is lent to
    it (for example, at night). It reserves nothing: the gang step's lease does.
    """

    ui_color = "#d5f5e3"

    def __init__(
        self,
        *,
        workers: int,
        devices_per_worker: int = 1,
        device_class: DeviceClass = "gpu",
        model: str | None = None,
        deferrable: bool = True,
        poll_s: float = 30.0,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("poke_interval", poll_s)
        super().__init__(**kwargs)
        self.request: GangRequestJson = {
            "gang_id": "capacity-probe",
            "team": "probe",
            "device_class": device_class,
            "model": model,
            "workers": workers,
            "devices_per_worker": devices_per_worker,
            "priority": 0,
            "preemptible": True,
        }
        self.deferrable = deferrable
        self.poll_s = poll_s

    def _paths(self) -> tuple[str, str | None]:
        settings = check_settings_at_start()
        return str(settings.ledger_path), settings.cluster

    def poke(self, context: Context) -> bool:
        ledger, cluster = self._paths()
        outcome = CapacityTrigger.check(self.request, ledger, cluster)
        if outcome["status"] == TriggerStatus.NEVER:
            raise AirflowException(f"tideflow: {outcome['reason']}")
        return outcome["status"] == TriggerStatus.AVAILABLE

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        ledger, cluster = self._paths()
        self.defer(
            trigger=CapacityTrigger(
                request=self.request,
                ledger_path=ledger,
                cluster_file=cluster,
                deadline=time.time() + float(self.timeout),
                poll_s=self.poll_s,
            ),
            method_name="capacity_ready",
        )

    def capacity_ready(self, context: Context, event: dict[str, Any]) -> None:
        if event["status"] != TriggerStatus.AVAILABLE:
            raise AirflowException(f"tideflow: no capacity for the gang: {event['reason']}")
        self.log.info("tideflow: capacity for the gang: %s", event["reason"])
