"""Triggers of the broker's sensors. Deadlines are absolute (epoch seconds), so a trigger
resumed by another triggerer after a restart does not get its waiting time back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

if TYPE_CHECKING:
    from tideflow.gangs import GangRequestJson

MODULE = "tideflow.operators.broker_triggers"


class BrokerDecisionTrigger(BaseTrigger):
    """Fires when the broker's policy, run on the current load, wants to act."""

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

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{MODULE}.BrokerDecisionTrigger", {
            "settings": self.settings,
            "ledger_path": self.ledger_path,
            "journal_path": self.journal_path,
            "cluster_file": self.cluster_file,
            "deadline": self.deadline,
            "poll_s": self.poll_s,
        }

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

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            event = await asyncio.to_thread(
                self.decide_now,
                self.settings,
                self.ledger_path,
                self.journal_path,
                self.cluster_file,
            )
            if event["action"] != "hold":
                yield TriggerEvent({"status": "act", **event})
                return
            if time.time() >= self.deadline:
                yield TriggerEvent({"status": "quiet", **event})
                return
            await asyncio.sleep(self.poll_s)


class CapacityTrigger(BaseTrigger):
    """Fires when a gang of the request's size could be placed now (reserving nothing)."""

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

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{MODULE}.CapacityTrigger", {
            "request": self.request,
            "ledger_path": self.ledger_path,
            "cluster_file": self.cluster_file,
            "deadline": self.deadline,
            "poll_s": self.poll_s,
        }

    @staticmethod
    def check(request: GangRequestJson, ledger: str, cluster: str | None) -> dict[str, Any]:
        from tideflow.gangs import open_ledger, request_from_dict
        from tideflow.scheduling import Refusal, place

        book = open_ledger(Path(ledger), cluster)
        wanted = request_from_dict(request)
        placed = place(wanted, book.inventory, book.used_devices(wanted.device_class))
        if isinstance(placed, Refusal):
            return {"status": "never" if placed.never else "waiting", "reason": placed.reason}
        return {"status": "available", "reason": f"{wanted.devices} {wanted.label()} free"}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            outcome = await asyncio.to_thread(
                self.check, self.request, self.ledger_path, self.cluster_file
            )
            if outcome["status"] in ("available", "never"):
                yield TriggerEvent(outcome)
                return
            if time.time() >= self.deadline:
                yield TriggerEvent({"status": "timeout", "reason": outcome["reason"]})
                return
            await asyncio.sleep(self.poll_s)
