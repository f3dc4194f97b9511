"""The gang step's triggers: serialize() round-trips, deadlines are absolute, events fire.

Runs the triggers' real ``run()`` coroutines against a real ledger and local
backend, as the triggerer would after deserialising them.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.trigger_helpers import first_event, round_trip
from tideflow.backends import GangJob, GangState, WorkerSlot
from tideflow.backends.local import LocalBackend
from tideflow.inventory import detect_local
from tideflow.operators.triggers import DeviceTrigger, GangTrigger, LeaseTrigger
from tideflow.scheduling import GangRequest, Lease, LeaseLedger

WORKER = str(Path(__file__).parents[1] / "gang_worker.py")


def request(gang_id: str, workers: int) -> dict[str, Any]:
    return {
        "gang_id": gang_id,
        "team": "qa",
        "device_class": "cpu",
        "model": None,
        "workers": workers,
        "devices_per_worker": 1,
        "priority": 0,
        "preemptible": True,
    }


def test_lease_trigger_round_trips_and_grants(tmp_path: Path) -> None:
    deadline = time.time() + 600
    trigger = round_trip(
        LeaseTrigger(
            request=request("g/1", 1),
            ledger_path=str(tmp_path / "leases.db"),
            cluster_file=None,
            holder="test",
            ttl_s=60,
            deadline=deadline,
            poll_s=0.1,
        )
    )
    assert trigger.deadline == deadline  # absolute, not "600 seconds from whenever"
    event = first_event(trigger)
    assert event["status"] == "granted"
    lease = LeaseLedger(tmp_path / "leases.db", detect_local()).lease_for("g/1")
    assert lease is not None and lease.lease_id == event["lease_id"]


def test_lease_trigger_reports_never_and_a_passed_deadline(tmp_path: Path) -> None:
    too_big = detect_local().total("cpu") + 1
    never = first_event(
        LeaseTrigger(
            request=request("g/big", too_big),
            ledger_path=str(tmp_path / "l.db"),
            cluster_file=None,
            holder="t",
            ttl_s=60,
            deadline=time.time() + 600,
            poll_s=0.1,
        )
    )
    assert never["status"] == "never" and "can never be placed" in never["reason"]
    book = LeaseLedger(tmp_path / "l.db", detect_local())
    cores = detect_local().total("cpu")
    blocker = book.try_acquire(GangRequest("other", "x", "cpu", None, cores, 1), "t", 600)
    assert isinstance(blocker, Lease)
    late = first_event(
        LeaseTrigger(
            request=request("g/late", 1),
            ledger_path=str(tmp_path / "l.db"),
            cluster_file=None,
            holder="t",
            ttl_s=60,
            deadline=time.time() - 1,
            poll_s=0.1,
        )
    )  # deadline already gone
    assert late["status"] == "timeout" and "do not fit now" in late["reason"]
    assert book.lease_for("g/late") is None


@pytest.mark.processes
def test_gang_trigger_round_trips_streams_and_fires(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = LocalBackend(tmp_path / "gangs")
    backend.submit(
        GangJob(
            "g/t",
            (sys.executable, WORKER),
            {"GANG_TEST_MODE": "ok"},
            (WorkerSlot(0, "localhost", (0,)),),
            "cpu",
            False,
            0,
        )
    )
    trigger = round_trip(
        GangTrigger(
            gang_id="g/t", state_dir=str(tmp_path / "gangs"), deadline=time.time() + 600, poll_s=0.1
        )
    )
    event = first_event(trigger)
    assert event["status"] == "finished" and '"state": "succeeded"' in event["gang"]
    assert trigger.log_offset > 0  # the gang's log was streamed into the task log
    # Rebuilt after a triggerer restart, from the kwargs it was deferred with (offset 0):
    # it must not stream the gang's log into the task log a second time.
    rebuilt = GangTrigger(
        gang_id="g/t", state_dir=str(tmp_path / "gangs"), deadline=time.time() + 600, poll_s=0.1
    )
    streamed: list[str] = []
    monkeypatch.setattr(rebuilt.log, "info", lambda fmt, *args: streamed.append(fmt % args))
    assert first_event(rebuilt)["status"] == "finished"
    assert rebuilt.log_offset == trigger.log_offset and streamed == []
    unknown = first_event(
        GangTrigger(
            gang_id="never-submitted",
            state_dir=str(tmp_path),
            deadline=time.time() + 600,
            poll_s=0.1,
        )
    )
    assert unknown["status"] == "unknown"


def test_device_trigger_round_trips_and_picks_the_cpu_when_allowed(tmp_path: Path) -> None:
    trigger = round_trip(
        DeviceTrigger(
            preferences=["npu", "gpu-spare", "cpu"],
            gang_id="e/1",
            team="qa",
            holder="t",
            ledger_path=str(tmp_path / "l.db"),
            cluster_file=None,
            ttl_s=60,
            deadline=time.time() + 600,
            poll_s=0.1,
        )
    )
    event = first_event(trigger)
    assert event == {
        "status": "granted",
        "preference": "cpu",
        "device_class": "cpu",
        "lease_id": None,
    }


@pytest.mark.processes
def test_gang_trigger_on_kill_cancels_the_gang(tmp_path: Path) -> None:
    """Airflow calls on_kill when a user marks a deferred task failed or clears it (not on a
    triggerer restart): the gang must not train on with nobody waiting for it."""
    backend = LocalBackend(tmp_path / "gangs")
    backend.submit(
        GangJob(
            "g/killed",
            (sys.executable, WORKER),
            {"GANG_TEST_MODE": "sleep"},
            (WorkerSlot(0, "localhost", (0,)), WorkerSlot(1, "localhost", (1,))),
            "cpu",
            False,
            0,
        )
    )
    trigger = round_trip(
        GangTrigger(
            gang_id="g/killed", state_dir=str(tmp_path / "gangs"), deadline=time.time() + 600
        )
    )
    deadline = time.time() + 60
    while (now := backend.status("g/killed")) is None or now.state is not GangState.RUNNING:
        assert time.time() < deadline, now
        time.sleep(0.1)
    asyncio.run(trigger.on_kill())
    status = backend.wait("g/killed", timeout_s=60)
    assert status.state is GangState.CANCELLED
