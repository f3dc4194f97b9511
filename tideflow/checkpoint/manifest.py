"""The manifest: the one object whose presence makes a checkpoint committed."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "tideflow-checkpoint/v1"
MANIFEST_NAME = "MANIFEST.json"
_CHUNK = 8 * 1024 * 1024


class CheckpointError(Exception):
    """A checkpoint cannot be written or read as asked."""


class CorruptCheckpointError(CheckpointError):
    """A shard is missing, truncated or does not match its recorded checksum."""


@dataclass(frozen=True)
class ShardRecord:
    name: str
    key: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest:
    step: int
    created_at: float
    shards: tuple[ShardRecord, ...]
    metrics: dict[str, float] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    uri: str = ""
    checksum: str = ""  # sha256 of the manifest bytes as stored

    def shard(self, name: str) -> ShardRecord:
        for record in self.shards:
            if record.name == name:
                return record
        raise CheckpointError(
            f"checkpoint step {self.step} has no shard {name!r}; "
            f"it has {[r.name for r in self.shards]}"
        )


def step_prefix(step: int) -> str:
    return f"step-{step:012d}"


def encode(
    step: int,
    created_at: float,
    shards: tuple[ShardRecord, ...],
    metrics: dict[str, float],
    meta: dict[str, Any],
) -> bytes:
    document = {
        "format": FORMAT,
        "step": step,
        "created_at": created_at,
        "shards": [
            {"name": s.name, "key": s.key, "sha256": s.sha256, "size": s.size} for s in shards
        ],
        "metrics": metrics,
        "meta": meta,
    }
    return json.dumps(document, sort_keys=True, indent=1).encode()


def decode(data: bytes, uri: str) -> Manifest:
    document = json.loads(data)
    if document.get("format") != FORMAT:
        raise CheckpointError(f"{uri}: unknown manifest format {document.get('format')!r}")
    shards = tuple(
        ShardRecord(s["name"], s["key"], s["sha256"], int(s["size"])) for s in document["shards"]
    )
    return Manifest(
        int(document["step"]),
        float(document["created_at"]),
        shards,
        {k: float(v) for k, v in document.get("metrics", {}).items()},
        dict(document.get("meta", {})),
        uri,
        hashlib.sha256(data).hexdigest(),
    )


def sha256_file(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size
