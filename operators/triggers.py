"""Triggers that let gang steps wait without holding an Airflow worker slot.

Both triggers carry absolute deadlines (epoch seconds), never relative
timeouts: a trigger that is serialised, and resumed by another triggerer after
a restart, must not get its waiting time back.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Required, TypeAlias, TypedDict

from airflow.triggers.base import BaseTrigger, TriggerEvent

if TYPE_CHECKING:
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


class LeaseTrigger(BaseTrigger):
    """Polls the lease ledger until the gang's devices are granted, or it can never fit."""

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

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{MODULE}.LeaseTrigger", {
            "request": self.request,
            "ledger_path": self.ledger_path,
            "cluster_file": self.cluster_file,
            "holder": self.holder,
            "ttl_s": self.ttl_s,
            "deadline": self.deadline,
            "poll_s": self.poll_s,
            "state_dir": self.state_dir,
        }

    def _try_once(self) -> dict[str, Any]:
        from tideflow.backends.local import LocalBackend
        from tideflow.gangs import enforce_evictions, open_ledger, request_from_dict
        from tideflow.scheduling import Lease

        ledger = open_ledger(Path(self.ledger_path), self.cluster_file)
        result = ledger.try_acquire(request_from_dict(self.request), self.holder, self.ttl_s)
        if isinstance(result, Lease):
            return {"status": "granted", "lease_id": result.lease_id}
        if self.state_dir is not None and not result.never:
            # The gangs in this one's way (if the ledger chose any) are asked to stop here.
            for step in enforce_evictions(ledger, LocalBackend(Path(self.state_dir))):
                self.log.info(
                    "tideflow: eviction of %s: %s %s", step.gang_id, step.action, step.detail
                )
        return {"status": "never" if result.never else "waiting", "reason": result.reason}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        last_reason = ""
        while True:
            outcome = await asyncio.to_thread(self._try_once)
            if outcome["status"] in ("granted", "never"):
                yield TriggerEvent({**outcome, "deadline": self.deadline})
                return
            if outcome["reason"] != last_reason:
                self.log.info("tideflow: waiting for devices: %s", outcome["reason"])
                last_reason = outcome["reason"]
            if time.time() >= self.deadline:
                yield TriggerEvent(
                    {"status": "timeout", "reason": outcome["reason"], "deadline": self.deadline}
                )
                return
            await asyncio.sleep(self.poll_s)


class GangTrigger(BaseTrigger):
    """Follows a running gang: streams its log into the task log, fires when it finishes."""

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

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{MODULE}.GangTrigger", {
            "gang_id": self.gang_id,
            "state_dir": self.state_dir,
            "deadline": self.deadline,
            "poll_s": self.poll_s,
            "log_offset": self.log_offset,
        }

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
        from tideflow.backends.local import LocalBackend

        backend = LocalBackend(Path(self.state_dir))
        await asyncio.to_thread(backend.cancel, self.gang_id)
        self.log.info("tideflow: gang %s cancelled with its task", self.gang_id)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from tideflow.backends.local import LocalBackend

        backend = LocalBackend(Path(self.state_dir))
        while True:
            status = await asyncio.to_thread(backend.status, self.gang_id)
            await asyncio.to_thread(self._stream_log, backend.log_path(self.gang_id))
            if status is None:
                yield TriggerEvent({"status": "unknown", "gang_id": self.gang_id})
                return
            if status.state.finished:
                yield TriggerEvent(
                    {"status": "finished", "gang": status.to_json(), "deadline": self.deadline}
                )
                return
            if time.time() >= self.deadline:
                yield TriggerEvent(
                    {"status": "timeout", "gang": status.to_json(), "deadline": self.deadline}
                )
                return
            await asyncio.sleep(self.poll_s)


class ClusterGangTrigger(BaseTrigger):
    """Follows a gang on Kubernetes (Volcano Job or JobSet) until it finishes.

    Watches the object (``kubernetes_asyncio``: no thread held, no polling);
    each change of state or restart count goes to the task log. The workers'
    own output is in their pods' logs (``kubectl logs -l tideflow.io/gang=...``).
    """

    def __init__(self, *, gang_id: str, deadline: float, watch_s: float = 300.0) -> None:
        super().__init__()
        self.gang_id = gang_id
        self.deadline = deadline
        self.watch_s = watch_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{MODULE}.ClusterGangTrigger", {
            "gang_id": self.gang_id,
            "deadline": self.deadline,
            "watch_s": self.watch_s,
        }

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
                        yield TriggerEvent({"status": "unknown", "gang_id": self.gang_id})
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
                        yield TriggerEvent(
                            {
                                "status": "finished",
                                "gang": status.to_json(),
                                "deadline": self.deadline,
                            }
                        )
                        return
                if time.time() >= self.deadline and last is not None:
                    yield TriggerEvent(
                        {"status": "timeout", "gang": last.to_json(), "deadline": self.deadline}
                    )
                    return


class DeviceTrigger(BaseTrigger):
    """Polls for the first device of a preference list (evaluation steps)."""

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

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{MODULE}.DeviceTrigger", {
            "preferences": self.preferences,
            "gang_id": self.gang_id,
            "team": self.team,
            "holder": self.holder,
            "ledger_path": self.ledger_path,
            "cluster_file": self.cluster_file,
            "ttl_s": self.ttl_s,
            "deadline": self.deadline,
            "poll_s": self.poll_s,
        }

    def _try_once(self) -> dict[str, Any]:
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
            return {"status": "never" if choice.never else "waiting", "reason": choice.reason}
        return {
            "status": "granted",
            "preference": choice.preference,
            "device_class": choice.device_class,
            "lease_id": choice.lease.lease_id if choice.lease else None,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            outcome = await asyncio.to_thread(self._try_once)
            if outcome["status"] in ("granted", "never"):
                yield TriggerEvent(outcome)
                return
            if time.time() >= self.deadline:
                yield TriggerEvent({"status": "timeout", "reason": outcome["reason"]})
                return
            await asyncio.sleep(self.poll_s)
