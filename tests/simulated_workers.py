"""What a gang's workers leave behind, for tests whose fake pods run no script.

A training script commits a checkpoint before its gang succeeds, and a gang step
that finds none fails (``tideflow.gangs.outputs``). Where the fake cluster only
marks pods succeeded, the test commits, as rank 0 would have, to the store the
gang object's pods were given.
"""

from __future__ import annotations

from typing import Any

from tideflow.checkpoint import CheckpointManager


def _env_value(obj: Any, name: str) -> str | None:
    if isinstance(obj, dict):
        if obj.get("name") == name and "value" in obj:
            return str(obj["value"])
        for value in obj.values():
            found = _env_value(value, name)
            if found is not None:
                return found
    elif isinstance(obj, list):
        for value in obj:
            found = _env_value(value, name)
            if found is not None:
                return found
    return None


def commit_as_workers(gang_object: dict[str, Any], step: int = 1) -> str:
    """Commit a one-shard checkpoint in the store of ``gang_object``'s pods; its URI."""
    uri = _env_value(gang_object, "TIDEFLOW_CHECKPOINT_URI")
    assert uri, "the gang object's pods have no TIDEFLOW_CHECKPOINT_URI"
    CheckpointManager(uri).save(step, {"model.pt": b"simulated worker"}, {"loss": 0.0})
    return uri
