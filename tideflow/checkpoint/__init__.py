"""Crash-consistent checkpoints: shards, then a manifest with their checksums."""

from tideflow.checkpoint.manager import CheckpointManager
from tideflow.checkpoint.manifest import (
    CheckpointError,
    CorruptCheckpointError,
    Manifest,
    ShardRecord,
)

__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "CorruptCheckpointError",
    "Manifest",
    "ShardRecord",
]
