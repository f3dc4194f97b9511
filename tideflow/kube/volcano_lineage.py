"""What a gang's Volcano Jobs remember from one to the next: how often it was stopped.

A preempted gang's Volcano Job is aborted, and ``submit`` replaces it with a new Job
under the same name (``tideflow.backends.kubernetes``, under Airflow as under Argo's
gang driver; a retry replaces a failed one the same way). No single Job lives
through a gang's stops, and Volcano keeps no count of them: its scheduler's preempt
and reclaim actions delete pods (recording only an ``Evict`` event and pod
condition), and the Job's ``AbortJob`` policy leaves only its phase. So each
replacement carries the count forward, in annotations:

* ``tideflow.io/lineage-uid`` and ``-created``: the uid and creation time of the
  gang's first Job, the key its stops are journaled under (each Job has its own uid,
  and a later attempt after a cancel reuses the name with a fresh count);
* ``tideflow.io/aborted``: how many of its earlier Jobs were aborted;
* ``tideflow.io/broker-stops``: how many of those aborts the broker caused.

Before it evicts a gang's pods, the broker marks the Job
(``tideflow.io/broker-stop``) with the Job's ``status.retryCount``. An abort is the
broker's when the Job is aborting or aborted under a mark of its own run: an
eviction that restarts the Job instead (a worker killed past its grace: PodFailed,
RestartJob, ``retryCount`` + 1) leaves a mark that no longer matches, so it
cannot claim a later abort, and a mark written twice (two brokers) is one stop.

A gang's stops by anything but the broker are then its aborts less the broker's:
Volcano's preempt and reclaim, and also a drain's evictions, which cost training
the same work. Only stops that abort the Job are seen: one that restarts it (an
exit other than 75 or 143) is not. The broker counts its own stops itself, so
those are not counted twice.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

LINEAGE_UID = "tideflow.io/lineage-uid"
LINEAGE_CREATED = "tideflow.io/lineage-created"
ABORTED = "tideflow.io/aborted"
BROKER_STOPS = "tideflow.io/broker-stops"
BROKER_STOP_MARK = "tideflow.io/broker-stop"
# The phases of a Job its AbortJob policy stopped (volcano pkg/controllers/job/state/
# running.go: AbortJob -> Aborting; aborting.go: Aborted once no pod runs).
ABORTED_PHASES = ("Aborting", "Aborted")


def _annotations(job: dict[str, Any]) -> dict[str, str]:
    return (job.get("metadata") or {}).get("annotations") or {}


def _count(job: dict[str, Any], key: str) -> int:
    """A carried count; anything but a non-negative whole number (an edited
    annotation) reads as 0 rather than failing the step that reads it."""
    value = str(_annotations(job).get(key, "0"))
    return int(value) if value.isascii() and value.isdigit() else 0


def phase(job: dict[str, Any]) -> str:
    return str(((job.get("status") or {}).get("state") or {}).get("phase", "Pending"))


def run_mark(job: dict[str, Any]) -> str:
    """The mark of the Job's current run: its restarts so far (``status.retryCount``,
    raised by each RestartJob, not by an abort)."""
    return str(int((job.get("status") or {}).get("retryCount", 0)))


def stopped_by_broker(job: dict[str, Any]) -> bool:
    """Whether this Job's abort is the broker's: aborted under a mark of its run."""
    return phase(job) in ABORTED_PHASES and _annotations(job).get(BROKER_STOP_MARK) == run_mark(job)


def aborts(job: dict[str, Any]) -> int:
    """How often the gang has been aborted: its earlier Jobs, and this one if it is."""
    return _count(job, ABORTED) + (1 if phase(job) in ABORTED_PHASES else 0)


def broker_stops(job: dict[str, Any]) -> int:
    """How many of those aborts the broker caused."""
    return _count(job, BROKER_STOPS) + (1 if stopped_by_broker(job) else 0)


def stops_by_others(job: dict[str, Any]) -> int:
    """The gang's stops the broker did not make (see the module docstring)."""
    return max(0, aborts(job) - broker_stops(job))


def lineage(job: dict[str, Any]) -> tuple[str, float]:
    """The uid and creation time (epoch seconds) of the gang's first Job."""
    meta = job.get("metadata") or {}
    carried = _annotations(job)
    uid = carried.get(LINEAGE_UID) or str(meta.get("uid", ""))
    created = carried.get(LINEAGE_CREATED) or str(meta.get("creationTimestamp", ""))
    try:
        created_s = datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp()
    except ValueError:
        created_s = 0.0  # unknown: the journal counts it from what it sees first
    return uid, created_s


def carried(job: dict[str, Any]) -> dict[str, str]:
    """The annotations the Job that replaces ``job`` carries forward (not the mark:
    it belongs to one Job's run)."""
    meta = job.get("metadata") or {}
    return {
        LINEAGE_UID: _annotations(job).get(LINEAGE_UID) or str(meta.get("uid", "")),
        LINEAGE_CREATED: _annotations(job).get(LINEAGE_CREATED)
        or str(meta.get("creationTimestamp", "")),
        ABORTED: str(aborts(job)),
        BROKER_STOPS: str(broker_stops(job)),
    }
