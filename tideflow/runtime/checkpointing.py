"""Asynchronous, multi-rank checkpoints on top of ``CheckpointManager``.

The training loop pays only for copying its tensors into CPU buffers (the
"stall", measured on every save); serialising, hashing and writing happen in a
background thread. Buffers are reused from save to save, so the copy lands in
memory that is already mapped instead of faulting in fresh pages; a CUDA
tensor's buffer is pinned and copied on a side stream
(``tideflow.runtime.pinned``).

Every rank writes its own shard (``rank-R.pt``: its RNG state and extras);
rank 0 also writes ``model.pt`` (model, optimizer, scaler, sampler, step).
They are committed as one checkpoint by ``GangCommit`` (receipts in the store,
no collective), so the commit never waits for the training loop.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from tideflow.checkpoint import CheckpointManager, Manifest
from tideflow.checkpoint.manifest import MODEL_SHARD, rank_shard
from tideflow.runtime.distributed import DistInfo
from tideflow.runtime.gang_commit import GangCommit
from tideflow.runtime.pinned import HostSnapshot

log = logging.getLogger("tideflow.runtime")


def _serialise(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _load(data: bytes) -> Any:
    # weights_only: a checkpoint never unpickles arbitrary objects
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


class AsyncCheckpointer:
    def __init__(
        self,
        manager: CheckpointManager,
        dist: DistInfo,
        on_commit: Callable[[Manifest], None] | None = None,
    ) -> None:
        self.manager = manager
        self.dist = dist
        self.on_commit = on_commit  # rank 0, e.g. record the checkpoint on the MLflow run
        self.stall_seconds: list[float] = []
        self.last_committed: Manifest | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._snapshots = (HostSnapshot(), HostSnapshot())
        self.gang_commit = GangCommit(manager, rank=dist.rank, world_size=dist.world_size)

    # -- saving --------------------------------------------------------------------
    def save(
        self,
        step: int,
        state: dict[str, Any],
        *,
        rank_state: dict[str, Any],
        metrics: dict[str, float] | None = None,
        meta: dict[str, Any] | None = None,
        block: bool = False,
    ) -> None:
        started = time.perf_counter()
        self.wait()  # the previous write still owns the buffers
        shared = self._snapshots[0].copy(state) if self.dist.is_main else None
        mine = self._snapshots[1].copy(rank_state)
        stall = time.perf_counter() - started
        self.stall_seconds.append(stall)
        log.info(
            "tideflow: checkpoint step %d: training paused %.1f ms for the snapshot",
            step,
            stall * 1000,
        )
        self._thread = threading.Thread(
            target=self._write,
            args=(step, shared, mine, dict(metrics or {}), dict(meta or {})),
            name=f"tideflow-checkpoint-{step}",
            daemon=True,
        )
        self._thread.start()
        if block:
            self.wait()

    def _write(
        self, step: int, shared: Any, mine: Any, metrics: dict[str, float], meta: dict[str, Any]
    ) -> None:
        try:
            shards = {rank_shard(self.dist.rank): _serialise(mine)}
            if self.dist.is_main:
                shards[MODEL_SHARD] = _serialise(shared)
            manifest = self.gang_commit.commit(
                step, shards, metrics=metrics, meta=meta, world_size=self.dist.world_size
            )
            if manifest is None:  # not rank 0: rank 0 commits
                return
            self.last_committed = manifest
            # Nothing is protected, not even the checkpoint this attempt resumed from
            # (often the one committed on preemption): it counts toward keep_last like
            # any other, and a restart resumes from the newer one just committed,
            # which retention never deletes.
            self.manager.apply_retention()
            log.info("tideflow: checkpoint step %d committed: %s", step, manifest.uri)
            if self.on_commit is not None:
                self.on_commit(manifest)
        except BaseException as exc:  # surfaced to the training loop by wait()
            self._error = exc

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"writing a checkpoint failed: {error}") from error

    def finalize(self) -> Manifest | None:
        """Wait for the outstanding write (and, on rank 0, its commit)."""
        self.wait()
        return self.last_committed

    # -- loading -------------------------------------------------------------------
    def load_latest(
        self, *, elastic: bool = False
    ) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
        """(step, shared state, this rank's state) of the newest committed checkpoint.

        A checkpoint written by a different number of ranks is refused unless
        the gang is ``elastic``; then a rank the checkpoint has no shard for
        gets an empty state (it starts its own RNG stream). A checkpoint that
        lacks a shard the gang would load is skipped for an older one.
        """
        manifest = self.manager.latest(require=self._resume_problems)
        if manifest is None:
            return None
        written_by = self._written_by(manifest)
        if written_by != self.dist.world_size and not elastic:
            raise RuntimeError(
                f"checkpoint step {manifest.step} was written by "
                f"{written_by} ranks, this gang has {self.dist.world_size}"
            )
        shared = _load(self.manager.read_shard(manifest, MODEL_SHARD))
        mine = (
            _load(self.manager.read_shard(manifest, rank_shard(self.dist.rank)))
            if self.dist.rank < written_by
            else {}
        )
        self.last_committed = manifest
        return manifest.step, shared, mine

    def _written_by(self, manifest: Manifest) -> int:
        # A checkpoint saved without a gang is read as if this gang had written it.
        return self.dist.world_size if manifest.world_size is None else manifest.world_size

    def _resume_problems(self, manifest: Manifest) -> list[str]:
        """The shards this rank would load that ``manifest`` lacks, as problems."""
        needed = [MODEL_SHARD]
        if self.dist.rank < self._written_by(manifest):
            needed.append(rank_shard(self.dist.rank))
        names = {record.name for record in manifest.shards}
        return [f"it has no shard {name}, needed to resume" for name in needed if name not in names]

    def mark_last_good(self) -> int | None:
        """Mark the newest committed checkpoint as the last good one (health stop)."""
        self.wait()
        manifest = self.last_committed or self.manager.latest()
        if manifest is None:
            return None
        if self.dist.is_main:
            self.manager.mark(manifest.step, "last-good")
        return manifest.step
