"""Sharded state (FSDP2, tensor parallel) saved through ``torch.distributed.checkpoint``.

DCP lets every rank write only its own part of a DTensor state dict, and lets
a later run load it at another world size (DCP reshards at load). This module
saves and loads through a DCP storage layer on a
:class:`~tideflow.checkpoint.CheckpointManager` (``tideflow.runtime.dcp_writer``,
``tideflow.runtime.dcp_reader``), so such checkpoints keep tideflow's commit
protocol and checksums:

* every file DCP asks for goes through ``manager.write_shard``: one data shard
  per rank that holds data (``__R_0.distcp``), and DCP's metadata
  (``dcp.metadata``), each with its SHA-256 and size recorded;
* each rank hands its shard records to the coordinator (rank 0) inside DCP's
  own ``WriteResult``s, gathered by DCP's collective; rank 0 writes the
  metadata shard and then commits ONE manifest listing every shard of every
  rank. The manifest is written last and create-only, so a save that dies
  before it leaves an uncommitted step that nothing loads (and that
  retention deletes once a newer step is committed);
* the manifest is committed with ``world_size=None`` (a DCP checkpoint has no
  ``model.pt``/``rank-R.pt`` gang layout); its ``meta`` says
  ``{"format": "torch-dcp", "world_size": <ranks that wrote it>}``;
* a load reads only committed checkpoints, and every shard it reads is
  checked against the manifest's SHA-256 and size before any byte of it is
  used; a damaged or missing shard raises ``CorruptCheckpointError`` naming it.

Nothing is unpickled beyond what a checkpoint needs: DCP's metadata is read
with an allow-list of DCP's own metadata classes, tensors with
``weights_only=True``, and DCP's non-tensor items (step counters, optimizer
hyper-parameters) are refused unless ``weights_only`` loading accepts them.
The checksums detect damage, not forgery: whoever may write the store may
also write a new self-consistent checkpoint.

Retention stays the caller's: rank 0 calls ``manager.apply_retention()``
after a commit, as with any other checkpoint.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from tideflow.checkpoint import CheckpointError, CheckpointManager, CorruptCheckpointError, Manifest
from tideflow.runtime.dcp_format import (
    # Pickles name the extent class as this module's (dcp_format.EXTENT_PICKLED_MODULE):
    # the metadata a save writes, the write results ranks send the coordinator.
    _Extent,  # noqa: F401
    dcp_problems,
)
from tideflow.runtime.dcp_reader import CheckpointStorageReader
from tideflow.runtime.dcp_writer import CheckpointStorageWriter
from tideflow.runtime.staging import Stagers

log = logging.getLogger("tideflow.runtime")

_T = TypeVar("_T")

__all__ = [
    "ShardedSave",
    "async_save_sharded",
    "load_sharded",
    "save_sharded",
]


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _checkpoint_error(exc: CheckpointException, what: str) -> BaseException:
    """The tideflow error among DCP's per-rank failures (the first by rank), else ``exc``."""
    for rank, (failure, _) in sorted(exc.failures.items()):
        if isinstance(failure, CheckpointError):
            return type(failure)(f"{what}: rank {rank}: {failure}")
    return exc


def _run_dcp(call: Callable[[], _T], what: str) -> _T:
    try:
        return call()
    except CheckpointException as exc:
        error = _checkpoint_error(exc, what)
        if error is exc:
            raise
        raise error from exc


def save_sharded(
    manager: CheckpointManager,
    step: int,
    state_dict: dict[str, Any],
    *,
    metrics: Mapping[str, float] | None = None,
    meta: Mapping[str, Any] | None = None,
    process_group: dist.ProcessGroup | None = None,
) -> Manifest | None:
    """Save ``state_dict`` (DTensors included) as checkpoint ``step``; every rank calls it.

    Returns when the checkpoint is committed on every rank (DCP ends with a
    collective): the manifest on the coordinator (rank 0), None elsewhere.
    If any rank fails, every rank raises and no manifest is written
    (``CheckpointError`` when the failure was the checkpoint's, such as a
    step that is already committed). Without a process group it saves the
    state of this one process.
    """
    writer = CheckpointStorageWriter(manager, step, metrics=metrics, meta=meta)
    _run_dcp(
        lambda: dcp_save(
            state_dict,
            storage_writer=writer,
            process_group=process_group,
            no_dist=not _distributed(),
        ),
        f"saving checkpoint step {step}",
    )
    return writer.manifest


class ShardedSave:
    """An asynchronous save under way; ``result()`` waits for its commit.

    ``stall_seconds`` is how long the call that started it held the training
    loop (waiting for the previous save, then copying the state); the rest
    (planning, writing, hashing, the commit) runs on a background thread.
    """

    def __init__(
        self, step: int, upload: Future[Any], writer: CheckpointStorageWriter, started: float
    ) -> None:
        self.step = step
        self.stall_seconds = time.perf_counter() - started
        self.seconds: float | None = None  # from the call to the commit, once done
        self._upload = upload
        self._writer = writer
        self._seen = False  # whether result() has told the caller how it ended
        # Future.result() may return before done-callbacks have run.
        self._timed = threading.Event()
        upload.add_done_callback(lambda _: self._finished(started))

    def _finished(self, started: float) -> None:
        self.seconds = time.perf_counter() - started
        self._timed.set()

    def done(self) -> bool:
        return self._upload.done()

    def result(self, timeout: float | None = None) -> Manifest | None:
        """Wait for the commit: the manifest on rank 0, None elsewhere; raises if it failed."""
        try:
            self._upload.result(timeout)
            self._timed.wait()
            self._seen = True
        except CheckpointException as exc:
            self._seen = True
            error = _checkpoint_error(exc, f"saving checkpoint step {self.step}")
            if error is exc:
                raise
            raise error from exc
        except BaseException:
            self._seen = self._upload.done()
            raise
        return self._writer.manifest

    def wait(self, timeout: float | None = None) -> Manifest | None:
        return self.result(timeout)


class _Background:
    """This process's background saves: the one in flight, their process groups, their stager."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.groups: dict[int, tuple[Any, dist.ProcessGroup]] = {}
        self.in_flight: ShardedSave | None = None
        self.stagers = Stagers()


_background = _Background()


def _checkpoint_group() -> dist.ProcessGroup:
    """A gloo group of all ranks, made once per default group, for background saves.

    The background thread's collectives must not share a group with the
    training loop's (FSDP's all-gathers run on the default group meanwhile):
    two threads issuing collectives on one group can pair them up wrongly.
    """
    world = dist.group.WORLD
    key = id(world)  # the group itself is held in the value, so the id is not reused
    if key not in _background.groups:
        _background.groups[key] = (world, dist.new_group(backend="gloo"))
    return _background.groups[key][1]


def async_save_sharded(
    manager: CheckpointManager,
    step: int,
    state_dict: dict[str, Any],
    *,
    metrics: Mapping[str, float] | None = None,
    meta: Mapping[str, Any] | None = None,
    process_group: dist.ProcessGroup | None = None,
) -> ShardedSave:
    """Start saving ``state_dict`` as checkpoint ``step``; every rank calls it at the same point.

    Returns once the state is copied (DCP's staging), so training may go on
    changing it: the checkpoint holds the state as it was at the call. The
    commit is exactly that of :func:`save_sharded`. A save still in flight
    is waited for first (and its error raised here, unless ``result()``
    already raised it), as two saves would share
    one group's collectives and one set of staging buffers. The staging
    copies are kept for the next save, which copies into them instead of
    allocating anew: this process holds one CPU copy of its part of the state
    from the first async save on. Without ``process_group`` the save runs on
    a dedicated gloo group (made collectively on the first call).
    """
    started = time.perf_counter()
    with _background.lock:
        previous, _background.in_flight = _background.in_flight, None
        if previous is not None and not previous._seen:
            previous.result()
        group = process_group
        if group is None and _distributed():
            group = _checkpoint_group()
        writer = CheckpointStorageWriter(manager, step, metrics=metrics, meta=meta)
        response = _run_dcp(
            lambda: dcp_async_save(
                state_dict,
                storage_writer=writer,
                async_stager=_background.stagers.next(state_dict),
                process_group=group,
                no_dist=not _distributed(),
            ),
            f"saving checkpoint step {step}",
        )
        upload = response if isinstance(response, Future) else response.upload_completion
        _background.in_flight = ShardedSave(step, upload, writer, started)
        return _background.in_flight


def _from_coordinator(
    choose: Callable[[], Manifest | None], process_group: dist.ProcessGroup | None
) -> Manifest | None:
    """``choose()`` on rank 0, its answer (or its error) on every rank.

    One rank picks, so every rank loads the same step even if a checkpoint
    is committed or damaged while they look.
    """
    if not _distributed() or dist.get_world_size(process_group) == 1:
        return choose()
    answer: list[Any] = [None, None]
    if dist.get_rank(process_group) == 0:
        try:
            answer[0] = choose()
        except CheckpointError as exc:
            answer[1] = exc
        except Exception as exc:  # others' errors may not pickle; keep their words
            answer[1] = CheckpointError(f"rank 0: {type(exc).__name__}: {exc}")
    dist.broadcast_object_list(answer, group=process_group, group_src=0)
    if answer[1] is not None:
        raise answer[1]
    manifest: Manifest | None = answer[0]
    return manifest


def _agree_on_metadata(
    reader: CheckpointStorageReader, process_group: dist.ProcessGroup | None
) -> None:
    """Read and check the metadata on every rank; all raise if any rank cannot."""
    problem = ""
    try:
        reader.read_metadata()
    except Exception as exc:
        problem = str(exc)
    problems = [problem]
    if _distributed() and dist.get_world_size(process_group) > 1:
        problems = [""] * dist.get_world_size(process_group)
        dist.all_gather_object(problems, problem, group=process_group)
    for rank, found in enumerate(problems):
        if found:
            raise CorruptCheckpointError(
                f"loading checkpoint step {reader.manifest.step}: rank {rank}: {found}"
            )


def load_sharded(
    manager: CheckpointManager,
    state_dict: dict[str, Any],
    *,
    step: int | None = None,
    verify: bool = True,
    process_group: dist.ProcessGroup | None = None,
) -> Manifest | None:
    """Load a committed DCP checkpoint into ``state_dict`` in place; every rank calls it.

    ``step=None`` loads the newest committed DCP checkpoint, skipping (with
    the manager's warning naming the reason) newer ones that are not DCP
    checkpoints or, when ``verify``, whose shards are damaged; None if there
    is none. A given ``step`` must be a committed DCP checkpoint, else
    ``CheckpointError``. Rank 0 picks the step for every rank; with
    ``verify`` it first checks every shard (reading the whole checkpoint
    once). Either way each rank checks every shard it reads before using it,
    and raises ``CorruptCheckpointError`` naming a damaged one; then every
    rank raises. A load that raised may have filled ``state_dict`` in part
    (from the shards read before the damaged one): do not train on it.
    The state is resharded to this run's world size.

    Returns the manifest loaded from, on every rank.
    """

    def choose() -> Manifest | None:
        if step is None:
            return manager.latest(verify=verify, require=dcp_problems)
        manifest = manager.load(step, verify=verify)
        problems = dcp_problems(manifest)
        if problems:
            raise CheckpointError(f"checkpoint step {step}: {'; '.join(problems)}")
        return manifest

    manifest = _from_coordinator(choose, process_group)
    if manifest is None:
        return None
    reader = CheckpointStorageReader(manager, manifest)
    _agree_on_metadata(reader, process_group)
    _run_dcp(
        lambda: dcp_load(
            state_dict,
            storage_reader=reader,
            process_group=process_group,
            no_dist=not _distributed(),
        ),
        f"loading checkpoint step {manifest.step}",
    )
    log.info("tideflow: loaded DCP checkpoint step %d from %s", manifest.step, manifest.uri)
    return manifest
