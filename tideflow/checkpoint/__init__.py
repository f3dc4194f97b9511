"""Crash-consistent checkpoints: shards, then a manifest with their checksums."""

from tideflow.checkpoint.manager import CheckpointManager
from tideflow.checkpoint.manifest import (
    CheckpointError,
    CorruptCheckpointError,
    Manifest,
    ShardRecord,
)

# The environment variable that tells a gang's workers where their checkpoints go.
CHECKPOINT_URI_ENV = "TIDEFLOW_CHECKPOINT_URI"

__all__ = [
    "CHECKPOINT_URI_ENV",
    "CheckpointError",
    "CheckpointManager",
    "CorruptCheckpointError",
    "Manifest",
    "ShardRecord",
]
