"""Crash-consistent checkpoints in any store: shards first, the manifest last.

Layout under the store URI:
    step-000000000120/model.pt
    step-000000000120/rank-1.pt
    step-000000000120/MANIFEST.json      <- written last, create-only
    marks/last-good.json

A checkpoint is committed when its manifest exists and is complete and
self-consistent (``manifest.decode`` says what that means). ``latest()`` also
verifies every shard (size and SHA-256) and skips, with a logged warning
naming the reason, a checkpoint whose manifest is refused or whose shards were
lost or damaged, so a half-written, corrupted or edited checkpoint is never
resumed from; ``load(step)`` raises instead. Retention deletes the manifest
before the shards, so a checkpoint being deleted stops counting as committed
first; it never deletes the newest checkpoint that verifies, nor a step whose
manifest it cannot accept. Only one process (rank 0) applies retention.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
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
    gang_layout_problem,
    sha256_file,
    shard_key,
    shard_name_problem,
    step_prefix,
)
from tideflow.storage import Store, UnsafeKeyError, check_key, open_store

log = logging.getLogger(__name__)
_STEP_DIR = re.compile(r"^step-(\d{12})/")

# What a caller needs of a checkpoint beyond its being valid (resume needs its
# rank's shard, say): the problems that rule ``manifest`` out, none if usable.
Requirement = Callable[[Manifest], list[str]]


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
        # Checksums of the manifests this manager committed: their shards were
        # hashed as they were written, so retention need not read them back.
        self._committed_here: set[str] = set()

    # -- writing ---------------------------------------------------------------
    def write_shard(self, step: int, name: str, data: bytes | Path) -> ShardRecord:
        if "/" in name or name == MANIFEST_NAME:
            raise CheckpointError(shard_name_problem(name))
        key = check_key(shard_key(step, name))
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
        *,
        world_size: int | None = None,
    ) -> Manifest:
        """Write the manifest (create-only). Re-committing the same shards is a no-op.

        The manifest records ``shards`` as the complete set, and ``world_size``
        (the ranks of a gang, each of which wrote ``rank-R.pt``) when given. A
        manifest that readers would refuse is never written: the shards must
        be this step's, non-empty, and complete for ``world_size``.
        """
        records = tuple(sorted(shards, key=lambda record: record.name))
        self._check_commit(step, records, world_size)
        key = f"{step_prefix(step)}/{MANIFEST_NAME}"
        data = encode(step, time.time(), records, metrics or {}, meta or {}, world_size=world_size)
        manifest = decode(data, self.store.url(key), step)  # refuse before writing, not after
        if self.store.put_bytes_if_absent(key, data):
            self._committed_here.add(manifest.checksum)
            return manifest
        existing = self._read_manifest(step)
        if existing is not None and existing.shards == records:
            return existing
        raise CheckpointError(
            f"step {step} is already committed with different shards; "
            "a committed checkpoint is never replaced"
        )

    @staticmethod
    def _check_commit(step: int, records: Sequence[ShardRecord], world_size: int | None) -> None:
        names = [record.name for record in records]
        if not names:
            raise CheckpointError(f"step {step}: a checkpoint needs at least one shard")
        if len(set(names)) != len(names):
            raise CheckpointError(f"step {step}: shard names repeat: {names}")
        foreign = [r.key for r in records if r.key != shard_key(step, r.name)]
        if foreign:
            raise CheckpointError(f"step {step}: shard keys {foreign} are not this step's")
        if world_size is not None:
            problem = gang_layout_problem(names, world_size)
            if problem:
                raise CheckpointError(f"step {step}: {problem}")

    def save(
        self,
        step: int,
        shards: Mapping[str, bytes | Path],
        metrics: Mapping[str, float] | None = None,
        meta: Mapping[str, Any] | None = None,
        *,
        world_size: int | None = None,
    ) -> Manifest:
        records = [self.write_shard(step, name, data) for name, data in shards.items()]
        return self.commit(step, records, metrics, meta, world_size=world_size)

    # -- reading ---------------------------------------------------------------
    def _read_manifest(self, step: int) -> Manifest | None:
        """The manifest of ``step``; None if it has none; CorruptCheckpointError if refused."""
        key = f"{step_prefix(step)}/{MANIFEST_NAME}"
        try:
            data = self.store.get_bytes(key)
        except UnsafeKeyError as exc:
            raise CorruptCheckpointError(f"checkpoint step {step}: {exc}") from exc
        except Exception:  # absent (FileNotFoundError / NoSuchKey)
            return None
        return decode(data, self.store.url(key), step)

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
            if key == f"{step_prefix(step)}/{MANIFEST_NAME}":
                committed.append(step)
        return sorted(committed), seen

    def committed(self) -> list[Manifest]:
        """The committed checkpoints whose manifests are valid, oldest first (shards unread)."""
        steps, _ = self._steps()
        manifests = []
        for step in steps:
            try:
                manifest = self._read_manifest(step)
            except CheckpointError as exc:
                log.warning("tideflow: ignoring checkpoint step %d: %s", step, exc)
                continue
            if manifest is not None:
                manifests.append(manifest)
        return manifests

    def load(self, step: int, *, verify: bool = True) -> Manifest:
        """The manifest of ``step``, which must be committed, valid and (``verify``) intact.

        Raises ``CheckpointError`` if ``step`` has no manifest, and
        ``CorruptCheckpointError`` naming the reason if it is refused.
        """
        manifest = self._read_manifest(step)
        if manifest is None:
            raise CheckpointError(f"no committed checkpoint at step {step} in {self.uri}")
        problems = self.verify(manifest) if verify else []
        if problems:
            raise CorruptCheckpointError(
                f"checkpoint step {step} ({manifest.uri}) is damaged: {'; '.join(problems)}"
            )
        return manifest

    def verify(self, manifest: Manifest) -> list[str]:
        """What is wrong with the shards of ``manifest`` as stored: missing, resized, altered."""
        problems = []
        for record in manifest.shards:
            with tempfile.TemporaryDirectory(prefix="tideflow-verify-") as scratch:
                local = Path(scratch) / "shard"
                try:
                    self.store.get_file(record.key, local)
                except UnsafeKeyError as exc:
                    problems.append(f"shard {record.name} cannot be read: {exc}")
                    continue
                except Exception:
                    problems.append(f"shard {record.name} is missing")
                    continue
                digest, size = sha256_file(local)
            if size != record.size:
                problems.append(f"shard {record.name} has {size} bytes, expected {record.size}")
            elif digest != record.sha256:
                problems.append(f"shard {record.name} does not match its SHA-256")
        return problems

    def latest(self, *, verify: bool = True, require: Requirement | None = None) -> Manifest | None:
        """The newest valid checkpoint (its shards verified unless ``verify`` is False).

        Newer checkpoints that are refused are skipped with a warning naming
        the reason; so is one that fails the caller's ``require``.
        """
        steps, _ = self._steps()
        for step in reversed(steps):
            try:
                manifest = self._read_manifest(step)
            except CheckpointError as exc:
                log.warning("tideflow: skipping checkpoint step %d: %s", step, exc)
                continue
            if manifest is None:  # deleted by retention since the listing
                continue
            problems = self.verify(manifest) if verify else []
            if not problems and require is not None:
                problems = require(manifest)
            if not problems:
                return manifest
            log.warning("tideflow: skipping checkpoint step %d: %s", step, "; ".join(problems))
        return None

    def read_shard(self, manifest: Manifest, name: str) -> bytes:
        record = self._own_shard(manifest, name)
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
        record = self._own_shard(manifest, name)
        self.store.get_file(record.key, path)
        digest, size = sha256_file(path)
        if size != record.size or digest != record.sha256:
            path.unlink(missing_ok=True)
            raise CorruptCheckpointError(
                f"step {manifest.step}: shard {name} is damaged (size or SHA-256 mismatch)"
            )

    @staticmethod
    def _own_shard(manifest: Manifest, name: str) -> ShardRecord:
        """The record of shard ``name``, refused if it points outside its checkpoint."""
        record = manifest.shard(name)
        if record.key != shard_key(manifest.step, record.name):
            raise CorruptCheckpointError(
                f"step {manifest.step}: shard {name} has key {record.key!r}, "
                f"not {shard_key(manifest.step, record.name)!r}"
            )
        return record

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
        """Keep the last K, the best by metric, the protected and the marked; delete the rest.

        The newest checkpoint that verifies is kept too, so newer checkpoints
        with damaged shards never cost the last one a resume can use. Steps
        whose manifests are refused are left alone: they are not understood,
        so they are not deleted.
        """
        manifests = self.committed()
        keep = {m.step for m in manifests[-self.keep_last :]} | set(protect) | self._marked_steps()
        newest_intact = self._newest_intact(manifests)
        if newest_intact is not None:
            keep.add(newest_intact)
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

    def _newest_intact(self, manifests: Sequence[Manifest]) -> int | None:
        for manifest in reversed(manifests):
            if manifest.checksum in self._committed_here or not self.verify(manifest):
                return manifest.step
        return None

    def _delete_step(self, step: int) -> None:
        prefix = step_prefix(step)
        self.store.delete(f"{prefix}/{MANIFEST_NAME}")  # first: stop counting as committed
        for key in self.store.list(prefix):
            self.store.delete(key)
