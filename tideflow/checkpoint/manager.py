"""Crash-consistent checkpoints in any store: shards first, the manifest last.

Layout under the store URI:
    step-000000000120/model.pt
    step-000000000120/rank-1.pt
    step-000000000120/MANIFEST.json      <- written last, create-only
    marks/last-good.json

A checkpoint is committed when its manifest exists and parses; ``latest()``
also verifies every shard (size and SHA-256) and skips a checkpoint whose
shards were lost or damaged, so a half-written or corrupted checkpoint is never
resumed from. Retention deletes the manifest before the shards, so a
checkpoint being deleted stops counting as committed first. Only one process
(rank 0) applies retention.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tideflow.checkpoint.manifest import (
    MANIFEST_NAME,
    CheckpointError,
    CorruptCheckpointError,
    Manifest,
    ShardRecord,
    decode,
    encode,
    sha256_file,
    step_prefix,
)
from tideflow.storage import Store, check_key, open_store

log = logging.getLogger(__name__)
_STEP_DIR = re.compile(r"^step-(\d{12})/")


class CheckpointManager:
    def __init__(
        self,
        uri: str,
        *,
        keep_last: int = 3,
        keep_best: tuple[str, str] | None = None,
        store: Store | None = None,
    ) -> None:
        if keep_last < 1:
            raise ValueError("keep_last must be >= 1")
        if keep_best is not None and keep_best[1] not in ("max", "min"):
            raise ValueError("keep_best mode must be 'max' or 'min'")
        self.uri = uri.rstrip("/")
        self.store = store or open_store(self.uri)
        self.keep_last = keep_last
        self.keep_best = keep_best

    # -- writing ---------------------------------------------------------------
    def write_shard(self, step: int, name: str, data: bytes | Path) -> ShardRecord:
        if "/" in name or name == MANIFEST_NAME:
            raise CheckpointError(
                f"shard name {name!r}: a plain file name other than {MANIFEST_NAME} is accepted"
            )
        key = check_key(f"{step_prefix(step)}/{name}")
        if isinstance(data, Path):
            # Hash on a second thread while the upload runs: the file is read
            # twice (the second time from the page cache) but the wall time is
            # the slower of the two, not their sum.
            with ThreadPoolExecutor(max_workers=1) as pool:
                hashing = pool.submit(sha256_file, data)
                self.store.put_file(key, data)
                digest, size = hashing.result()
        else:
            digest, size = hashlib.sha256(data).hexdigest(), len(data)
            self.store.put_bytes(key, data)
        return ShardRecord(name, key, digest, size)

    def commit(
        self,
        step: int,
        shards: Sequence[ShardRecord],
        metrics: Mapping[str, float] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> Manifest:
        """Write the manifest (create-only). Re-committing the same shards is a no-op."""
        records = tuple(sorted(shards, key=lambda record: record.name))
        names = [record.name for record in records]
        if len(set(names)) != len(names):
            raise CheckpointError(f"step {step}: shard names repeat: {names}")
        key = f"{step_prefix(step)}/{MANIFEST_NAME}"
        data = encode(step, time.time(), records, dict(metrics or {}), dict(meta or {}))
        if self.store.put_bytes_if_absent(key, data):
            return decode(data, self.store.url(key))
        existing = self._read_manifest(step)
        if existing is not None and existing.shards == records:
            return existing
        raise CheckpointError(
            f"step {step} is already committed with different shards; "
            "a committed checkpoint is never replaced"
        )

    def save(
        self,
        step: int,
        shards: Mapping[str, bytes | Path],
        metrics: Mapping[str, float] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> Manifest:
        records = [self.write_shard(step, name, data) for name, data in shards.items()]
        return self.commit(step, records, metrics, meta)

    # -- reading ---------------------------------------------------------------
    def _read_manifest(self, step: int) -> Manifest | None:
        key = f"{step_prefix(step)}/{MANIFEST_NAME}"
        try:
            data = self.store.get_bytes(key)
        except Exception:  # absent (FileNotFoundError / NoSuchKey)
            return None
        try:
            return decode(data, self.store.url(key))
        except (CheckpointError, ValueError, KeyError) as exc:
            log.warning("tideflow: ignoring unreadable checkpoint manifest %s: %s", key, exc)
            return None

    def _steps(self) -> tuple[list[int], set[int]]:
        """(steps with a manifest, steps with any object) found in the store."""
        committed: list[int] = []
        seen: set[int] = set()
        for key in self.store.list():
            match = _STEP_DIR.match(key)
            if match is None:
                continue
            step = int(match.group(1))
            seen.add(step)
            if key.endswith(f"/{MANIFEST_NAME}"):
                committed.append(step)
        return sorted(committed), seen

    def committed(self) -> list[Manifest]:
        steps, _ = self._steps()
        return [m for m in (self._read_manifest(step) for step in steps) if m is not None]

    def verify(self, manifest: Manifest) -> list[str]:
        problems = []
        for record in manifest.shards:
            with tempfile.TemporaryDirectory(prefix="tideflow-verify-") as scratch:
                local = Path(scratch) / "shard"
                try:
                    self.store.get_file(record.key, local)
                except Exception:
                    problems.append(f"shard {record.name} is missing")
                    continue
                digest, size = sha256_file(local)
            if size != record.size:
                problems.append(f"shard {record.name} has {size} bytes, expected {record.size}")
            elif digest != record.sha256:
                problems.append(f"shard {record.name} does not match its SHA-256")
        return problems

    def latest(self, *, verify: bool = True) -> Manifest | None:
        for manifest in reversed(self.committed()):
            problems = self.verify(manifest) if verify else []
            if not problems:
                return manifest
            log.warning(
                "tideflow: skipping checkpoint step %d: %s", manifest.step, "; ".join(problems)
            )
        return None

    def read_shard(self, manifest: Manifest, name: str) -> bytes:
        record = manifest.shard(name)
        try:
            data = self.store.get_bytes(record.key)
        except Exception as exc:
            raise CorruptCheckpointError(f"step {manifest.step}: shard {name} is missing") from exc
        if len(data) != record.size or hashlib.sha256(data).hexdigest() != record.sha256:
            raise CorruptCheckpointError(
                f"step {manifest.step}: shard {name} is damaged (size or SHA-256 mismatch)"
            )
        return data

    def download_shard(self, manifest: Manifest, name: str, path: Path) -> None:
        record = manifest.shard(name)
        self.store.get_file(record.key, path)
        digest, size = sha256_file(path)
        if size != record.size or digest != record.sha256:
            path.unlink(missing_ok=True)
            raise CorruptCheckpointError(
                f"step {manifest.step}: shard {name} is damaged (size or SHA-256 mismatch)"
            )

    # -- marks and retention -----------------------------------------------------
    def mark(self, step: int, label: str) -> None:
        key = check_key(f"marks/{label}.json")
        self.store.put_bytes(key, json.dumps({"step": step, "at": time.time()}).encode())

    def marked(self, label: str) -> int | None:
        try:
            data = self.store.get_bytes(check_key(f"marks/{label}.json"))
        except Exception:
            return None
        return int(json.loads(data)["step"])

    def _marked_steps(self) -> set[int]:
        steps = set()
        for key in self.store.list("marks"):
            label = key.rsplit("/", 1)[1].removesuffix(".json")
            step = self.marked(label)
            if step is not None:
                steps.add(step)
        return steps

    def apply_retention(self, protect: Iterable[int] = ()) -> list[int]:
        """Keep the last K, the best by metric, the protected and the marked; delete the rest."""
        manifests = self.committed()
        keep = {m.step for m in manifests[-self.keep_last :]} | set(protect) | self._marked_steps()
        if self.keep_best is not None:
            metric, mode = self.keep_best
            scored = [m for m in manifests if metric in m.metrics]
            if scored:
                pick = max if mode == "max" else min
                keep.add(pick(scored, key=lambda m: m.metrics[metric]).step)
        deleted = []
        for manifest in manifests:
            if manifest.step in keep:
                continue
            self._delete_step(manifest.step)
            deleted.append(manifest.step)
        committed_steps, seen = self._steps()
        newest = max(committed_steps, default=-1)
        for step in sorted(seen - set(committed_steps)):
            if step < newest:  # shards of a save that crashed before its manifest
                self._delete_step(step)
        return deleted

    def _delete_step(self, step: int) -> None:
        prefix = step_prefix(step)
        self.store.delete(f"{prefix}/{MANIFEST_NAME}")  # first: stop counting as committed
        for key in self.store.list(prefix):
            self.store.delete(key)
