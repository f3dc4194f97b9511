"""What every tideflow trigger shares: its serialized form, its poll loop, its status words.

A trigger is serialized by its classpath and its constructor's keyword arguments,
each kept as the attribute of the same name; Airflow stores both, and a triggerer
(maybe another one, after a restart) rebuilds the trigger from them. Deadlines are
absolute (epoch seconds), never relative timeouts, so a rebuilt trigger does not
get its waiting time back.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator
from typing import Any, ClassVar, Final

from airflow.triggers.base import BaseTrigger, TriggerEvent


class TriggerStatus:
    """The ``status`` of a trigger's event, which the operators' callbacks read.

    Plain strings, not an Enum: the event's payload is stored as JSON and read
    back as strings by the task that resumes.
    """

    GRANTED: Final = "granted"  # a lease (or a device) is granted
    NEVER: Final = "never"  # the request can never be met: fail, do not retry
    TIMEOUT: Final = "timeout"  # the deadline passed while waiting
    FINISHED: Final = "finished"  # the gang finished (its state says how)
    UNKNOWN: Final = "unknown"  # the backend does not know the gang
    AVAILABLE: Final = "available"  # a gang of the size could be placed now
    ACT: Final = "act"  # the broker's policy wants to act
    QUIET: Final = "quiet"  # the broker's policy held until the deadline
    # A poll's outcome that ends no wait; never the status of an event.
    WAITING: Final = "waiting"


def refused(never: bool, reason: str) -> dict[str, Any]:
    """A poll's outcome for a refusal: it ends the wait when it can never be met."""
    return {"status": TriggerStatus.NEVER if never else TriggerStatus.WAITING, "reason": reason}


class TideflowTrigger(BaseTrigger):
    """A trigger serialized from its constructor's keyword arguments.

    ``classpath_module`` is where Airflow imports the trigger from: the name it is
    stored under, kept whichever name the module was imported by.
    """

    classpath_module: ClassVar[str]

    def serialize(self) -> tuple[str, dict[str, Any]]:
        cls = type(self)
        fields = inspect.signature(cls.__init__).parameters
        kwargs = {name: getattr(self, name) for name in fields if name != "self"}
        return f"{cls.classpath_module}.{cls.__name__}", kwargs


class PollingTrigger(TideflowTrigger):
    """Asks one question every ``poll_s`` seconds until an answer ends the wait or the
    ``deadline`` passes.

    ``poll`` runs in a thread (it may block) and returns the event's payload when
    its ``status`` ends the wait; with ``TriggerStatus.WAITING`` the loop waits on,
    and at the deadline fires ``timed_out`` of the last outcome.
    """

    deadline: float
    poll_s: float

    def poll(self) -> dict[str, Any]:
        raise NotImplementedError

    def waiting(self, outcome: dict[str, Any]) -> None:
        """Called with each outcome that does not end the wait (to log it)."""

    def timed_out(self, outcome: dict[str, Any]) -> dict[str, Any]:
        return {"status": TriggerStatus.TIMEOUT, "reason": outcome["reason"]}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            outcome = await asyncio.to_thread(self.poll)
            if outcome["status"] != TriggerStatus.WAITING:
                yield TriggerEvent(outcome)
                return
            self.waiting(outcome)
            if time.time() >= self.deadline:
                yield TriggerEvent(self.timed_out(outcome))
                return
            await asyncio.sleep(self.poll_s)
