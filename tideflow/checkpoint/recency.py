"""When a training gang last committed a checkpoint, read from its checkpoint store.

The broker picks victims by the work each gang would lose, which is the time
since its newest committed checkpoint, and a stop forced past its grace loses
that work. Neither the lease ledger nor the cluster knows that time; the
gang's checkpoint store does (each manifest records when it was written), so
the actuators and the gang layer ask the store the gang was given. A store
that cannot be read gives ``None``: the caller then falls back to the gang's
start, which overstates the work at risk (the safe direction).
"""

from __future__ import annotations

import logging

from tideflow.checkpoint.manager import CheckpointManager

log = logging.getLogger(__name__)


def newest_checkpoint_at(store_uri: str | None) -> float | None:
    """Epoch seconds of the newest committed checkpoint under ``store_uri``, if any."""
    if not store_uri:
        return None
    try:
        manifest = CheckpointManager(store_uri).latest(verify=False)
    except Exception as error:  # any store failure means "unknown"
        log.warning("broker: cannot read checkpoints under %s (%s)", store_uri, error)
        return None
    return manifest.created_at if manifest is not None else None


def work_at_risk_since(started_at: float, store_uri: str | None) -> float:
    """Since when a gang's work is uncommitted: its newest checkpoint, or its start."""
    committed = newest_checkpoint_at(store_uri)
    return started_at if committed is None else max(started_at, committed)


def work_lost_at(now: float, started_at: float, store_uri: str | None) -> float:
    """Seconds of work a stop at ``now`` throws away: since the newest checkpoint."""
    return max(0.0, now - work_at_risk_since(started_at, store_uri))
