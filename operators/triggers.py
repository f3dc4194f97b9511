"""Triggers that let gang steps wait without holding an Airflow worker slot.

Each carries an absolute deadline (``tideflow.operators.trigger_base``), and is
stored by Airflow as ``tideflow.operators.triggers.<class>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Required, TypeAlias, TypedDict

from airflow.triggers.base import TriggerEvent

from tideflow.operators.trigger_base import PollingTrigger, TideflowTrigger, refused
from tideflow.operators.trigger_base import TriggerStatus as TriggerStatus  # noqa: PLC0414 (operators)

if TYPE_CHECKING:
    from tideflow.backends.local import LocalBackend
    from tideflow.gangs import GangRequestJson

MODULE = "tideflow.operators.triggers"


# Airflow's own type for the keyword arguments a deferred task resumes with
# (BaseOperator.resume_execution: the trigger's event, or Airflow's failure reason).
ResumeKwargs: TypeAlias = "dict[str, Any]"


class LeaseEvent(TypedDict, total=False):
    """What ``LeaseTrigger`` fires with."""

    status: Required[str]  # granted, never or timeout
    lease_id: str  # granted
    reason: str  # never, timeout: why the gang does not fit (now)
    deadline: float


class GangEvent(TypedDict, total=False):
    """What ``GangTrigger`` and ``ClusterGangTrigger`` fire with."""

    status: Required[str]  # finished, timeout or unknown
    gang: str  # the gang's status as JSON (GangStatus.to_json)
    gang_id: str  # unknown: the gang the backend does not know
    deadline: float


class LeaseTrigger(PollingTrigger):
    """Polls the lease ledger until the gang's devices are granted, or it can never fit."""

    classpath_module: ClassVar[str] = MODULE

    def __init__(
        self,
        *,
        request: GangRequestJson,
        ledger_path: str,
        cluster_file: str | None,
        holder: str,
        ttl_s: float,
        deadline: float,
        poll_s: float = 5.0,
        state_dir: str | None = None,
    ) -> None:
        super().__init__()
        self.state_dir = state_dir  # the local backend's: where this poll carries out evictions
        self.request = request
        self.ledger_path = ledger_path
        self.cluster_file = cluster_file
        self.holder = holder
        self.ttl_s = ttl_s
        self.deadline = deadline
        self.poll_s = poll_s
        self._last_reason = ""

    def poll(self) -> dict[str, Any]:
        from tideflow.backends.local import LocalBackend
        from tideflow.gangs import enforce_evictions, open_ledger, request_from_dict
        from tideflow.scheduling import Lease

        ledger = open_ledger(Path(self.ledger_path), self.cluster_file)
        result = ledger.try_acquire(request_from_dict(self.request), self.holder, self.ttl_s)
        if isinstance(result, Lease):
            granted = {"status": TriggerStatus.GRANTED, "lease_id": result.lease_id}
            return {**granted, "deadline": self.deadline}
        if result.never:
            never = {"status": TriggerStatus.NEVER, "reason": result.reason}
            return {**never, "deadline": self.deadline}
        if self.state_dir is not None:
            # The gangs in this one's way (if the ledger chose any) are asked to stop here.
            for step in enforce_evictions(ledger, LocalBackend(Path(self.state_dir))):
                self.log.info(
                    "tideflow: eviction of %s: %s %s", step.gang_id, step.action, step.detail
                )
        return {"status": TriggerStatus.WAITING, "reason": result.reason}

    def waiting(self, outcome: dict[str, Any]) -> None:
        if outcome["reason"] != self._last_reason:
            self.log.info("tideflow: waiting for devices: %s", outcome["reason"])
            self._last_reason = outcome["reason"]

    def timed_out(self, outcome: dict[str, Any]) -> dict[str, Any]:
        return {**super().timed_out(outcome), "deadline": self.deadline}


class GangTrigger(PollingTrigger):
    """Follows a running gang: streams its log into the task log, fires when it finishes."""

    classpath_module: ClassVar[str] = MODULE

    def __init__(
        self,
        *,
        gang_id: str,
        state_dir: str,
        deadline: float,
        poll_s: float = 2.0,
        log_offset: int = 0,
    ) -> None:
        super().__init__()
        self.gang_id = gang_id
        self.state_dir = state_dir
        self.deadline = deadline
        self.poll_s = poll_s
        self.log_offset = log_offset

    @cached_property
    def _backend(self) -> LocalBackend:
        from tideflow.backends.local import LocalBackend

        return LocalBackend(Path(self.state_dir))

    def _stream_log(self, path: Path) -> None:
        # How far the task log has got is kept beside the gang's log too: a trigger
        # rebuilt after a triggerer restart has only its serialized offset (from when
        # the task deferred) and would stream the whole log into the task log again.
        mark = path.with_name("task-log-offset")
        with contextlib.suppress(FileNotFoundError, ValueError):
            self.log_offset = max(self.log_offset, int(mark.read_text()))
        try:
            with open(path, encoding="utf-8", errors="replace") as log:
                log.seek(self.log_offset)
                for line in log:
                    self.log.info("%s", line.rstrip("\n"))
                self.log_offset = log.tell()
        except FileNotFoundError:
            return
        mark.write_text(str(self.log_offset))

    async def on_kill(self) -> None:
        """A user marked the deferred task failed, succeeded or cleared: stop the gang too.

        (Not on a triggerer restart: Airflow calls this only for a user's action.)
        The gang's supervisor releases its lease as the workers stop.
        """
        await asyncio.to_thread(self._backend.cancel, self.gang_id)
        self.log.info("tideflow: gang %s cancelled with its task", self.gang_id)

    def poll(self) -> dict[str, Any]:
        status = self._backend.status(self.gang_id)
        self._stream_log(self._backend.log_path(self.gang_id))
        if status is None:
            return {"status": TriggerStatus.UNKNOWN, "gang_id": self.gang_id}
        if status.state.finished:
            finished = {"status": TriggerStatus.FINISHED, "gang": status.to_json()}
            return {**finished, "deadline": self.deadline}
        return {"status": TriggerStatus.WAITING, "gang": status.to_json()}

    def timed_out(self, outcome: dict[str, Any]) -> dict[str, Any]:
        timeout = {"status": TriggerStatus.TIMEOUT, "gang": outcome["gang"]}
        return {**timeout, "deadline": self.deadline}


class ClusterGangTrigger(TideflowTrigger):
    """Follows a gang on Kubernetes (Volcano Job or JobSet) until it finishes.

    Watches the object (``kubernetes_asyncio``: no thread held, no polling);
    each change of state or restart count goes to the task log. The workers'
    own output is in their pods' logs (``kubectl logs -l tideflow.io/gang=...``).
    """

    classpath_module: ClassVar[str] = MODULE

    def __init__(self, *, gang_id: str, deadline: float, watch_s: float = 300.0) -> None:
        super().__init__()
        self.gang_id = gang_id
        self.deadline = deadline
        self.watch_s = watch_s

    async def on_kill(self) -> None:
        """A user marked the deferred task failed, succeeded or cleared: delete the gang too."""
        from tideflow.operators.cluster import cluster_backend

        backend = await asyncio.to_thread(cluster_backend)
        await asyncio.to_thread(backend.cancel, self.gang_id)
        self.log.info("tideflow: gang %s deleted with its task", self.gang_id)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from tideflow.backends.kubernetes import follow
        from tideflow.kube.settings import kube_settings_from_env
        from tideflow.operators.cluster import async_api_client

        settings = kube_settings_from_env()
        seen = None
        last = None
        async with async_api_client() as api:
            while True:
                timeout = max(1.0, min(self.watch_s, self.deadline - time.time()))
                async for status in follow(api, settings, self.gang_id, timeout_s=timeout):
                    if status is None:
                        yield TriggerEvent(
                            {"status": TriggerStatus.UNKNOWN, "gang_id": self.gang_id}
                        )
                        return
                    last = status
                    if (status.state, status.restarts) != seen:
                        seen = (status.state, status.restarts)
                        self.log.info(
                            "tideflow: gang %s is %s (%d restart(s)): %s",
                            self.gang_id,
                            status.state,
                            status.restarts,
                            status.message,
                        )
                    if status.state.finished:
                        finished = {"status": TriggerStatus.FINISHED, "gang": status.to_json()}
                        yield TriggerEvent({**finished, "deadline": self.deadline})
                        return
                if time.time() >= self.deadline and last is not None:
                    timeout_event = {"status": TriggerStatus.TIMEOUT, "gang": last.to_json()}
                    yield TriggerEvent({**timeout_event, "deadline": self.deadline})
                    return


class DeviceTrigger(PollingTrigger):
    """Polls for the first device of a preference list (evaluation steps)."""

    classpath_module: ClassVar[str] = MODULE

    def __init__(
        self,
        *,
        preferences: list[str],
        gang_id: str,
        team: str,
        holder: str,
        ledger_path: str,
        cluster_file: str | None,
        ttl_s: float,
        deadline: float,
        poll_s: float = 5.0,
    ) -> None:
        super().__init__()
        self.preferences = preferences
        self.gang_id = gang_id
        self.team = team
        self.holder = holder
        self.ledger_path = ledger_path
        self.cluster_file = cluster_file
        self.ttl_s = ttl_s
        self.deadline = deadline
        self.poll_s = poll_s

    def poll(self) -> dict[str, Any]:
        from tideflow.gangs import open_ledger
        from tideflow.scheduling import Refusal, choose_device

        ledger = open_ledger(Path(self.ledger_path), self.cluster_file)
        choice = choose_device(
            ledger,
            tuple(self.preferences),
            gang_id=self.gang_id,
            team=self.team,
            holder=self.holder,
            ttl_s=self.ttl_s,
        )
        if isinstance(choice, Refusal):
            return refused(choice.never, choice.reason)
        return {
            "status": TriggerStatus.GRANTED,
            "preference": choice.preference,
            "device_class": choice.device_class,
            "lease_id": choice.lease.lease_id if choice.lease else None,
        }
