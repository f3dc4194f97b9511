"""Triggers of the broker's sensors, stored by Airflow as
``tideflow.operators.broker_triggers.<class>``; their deadlines are absolute
(``tideflow.operators.trigger_base``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from tideflow.operators.trigger_base import PollingTrigger, TriggerStatus, refused

if TYPE_CHECKING:
    from tideflow.gangs import GangRequestJson

MODULE = "tideflow.operators.broker_triggers"


class BrokerDecisionTrigger(PollingTrigger):
    """Fires when the broker's policy, run on the current load, wants to act."""

    classpath_module: ClassVar[str] = MODULE

    def __init__(
        self,
        *,
        settings: dict[str, Any],
        ledger_path: str,
        journal_path: str,
        cluster_file: str | None,
        deadline: float,
        poll_s: float = 30.0,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.ledger_path = ledger_path
        self.journal_path = journal_path
        self.cluster_file = cluster_file
        self.deadline = deadline
        self.poll_s = poll_s

    @staticmethod
    def decide_now(
        settings: dict[str, Any], ledger: str, journal: str, cluster: str | None
    ) -> dict[str, Any]:
        from tideflow.broker.service import open_local, peek
        from tideflow.broker.settings import BrokerSettings

        load, actuator, config, book = open_local(
            BrokerSettings(**settings), Path(ledger), Path(journal), cluster
        )
        decision = peek(load, actuator, config, book)
        return {
            "action": str(decision.action),
            "inference_gpus": decision.inference_gpus,
            "emergency": decision.emergency,
            "reason": decision.reason,
        }

    def poll(self) -> dict[str, Any]:
        event = self.decide_now(
            self.settings, self.ledger_path, self.journal_path, self.cluster_file
        )
        acts = event["action"] != "hold"
        return {"status": TriggerStatus.ACT if acts else TriggerStatus.WAITING, **event}

    def timed_out(self, outcome: dict[str, Any]) -> dict[str, Any]:
        return {**outcome, "status": TriggerStatus.QUIET}


class CapacityTrigger(PollingTrigger):
    """Fires when a gang of the request's size could be placed now (reserving nothing)."""

    classpath_module: ClassVar[str] = MODULE

    def __init__(
        self,
        *,
        request: GangRequestJson,
        ledger_path: str,
        cluster_file: str | None,
        deadline: float,
        poll_s: float = 30.0,
    ) -> None:
        super().__init__()
        self.request = request
        self.ledger_path = ledger_path
        self.cluster_file = cluster_file
        self.deadline = deadline
        self.poll_s = poll_s

    @staticmethod
    def check(request: GangRequestJson, ledger: str, cluster: str | None) -> dict[str, Any]:
        from tideflow.gangs import open_ledger, request_from_dict
        from tideflow.scheduling import Refusal, place

        book = open_ledger(Path(ledger), cluster)
        wanted = request_from_dict(request)
        placed = place(wanted, book.inventory, book.used_devices(wanted.device_class))
        if isinstance(placed, Refusal):
            return refused(placed.never, placed.reason)
        free = f"{wanted.devices} {wanted.label()} free"
        return {"status": TriggerStatus.AVAILABLE, "reason": free}

    def poll(self) -> dict[str, Any]:
        return self.check(self.request, self.ledger_path, self.cluster_file)
