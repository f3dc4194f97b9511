"""Sharded state (FSDP2, tensor parallel) saved through ``torch.distributed.checkpoint``.

DCP lets every rank write only its own part of a DTensor state dict, and lets
a later run load it at another world size (DCP reshards at load). This module
is a DCP storage layer on a :class:`~tideflow.checkpoint.CheckpointManager`,
so such checkpoints keep tideflow's commit protocol and checksums:

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

import dataclasses
import io
import logging
import pickle
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future as TorchFuture

from tideflow.checkpoint import (
    CheckpointError,
    CheckpointManager,
    CorruptCheckpointError,
    Manifest,
    ShardRecord,
)
from tideflow.checkpoint.manifest import MANIFEST_NAME, shard_name_problem, step_prefix
from tideflow.runtime.staging import Stagers

log = logging.getLogger("tideflow.runtime")

DCP_FORMAT = "torch-dcp"
METADATA_SHARD = "dcp.metadata"
DATA_SUFFIX = ".distcp"
# DCP's own metadata version for the layout written here (one file per rank,
# tensors saved with torch.save at recorded offsets).
_DCP_VERSION = "1.0.0"
_T = TypeVar("_T")

__all__ = [
    "DCP_FORMAT",
    "METADATA_SHARD",
    "CheckpointStorageReader",
    "CheckpointStorageWriter",
    "ShardedSave",
    "async_save_sharded",
    "dcp_problems",
    "load_sharded",
    "save_sharded",
]


@dataclass(frozen=True)
class _Extent:
    """Where one saved item lies: its shard, and the byte range inside it."""

    shard: str
    offset: int
    length: int


@dataclass(frozen=True)
class _Written:
    """A rank's account of one item it wrote: where, and the record of the shard holding it."""

    extent: _Extent
    record: ShardRecord


def dcp_problems(manifest: Manifest) -> list[str]:
    """Why ``manifest`` is not a DCP checkpoint this module can load; empty if it is."""
    if manifest.meta.get("format") != DCP_FORMAT:
        return [
            f"it is not a {DCP_FORMAT} checkpoint (meta format {manifest.meta.get('format')!r})"
        ]
    if METADATA_SHARD not in {record.name for record in manifest.shards}:
        return [f"it has no shard {METADATA_SHARD}"]
    return []


# -- writing -------------------------------------------------------------------------------


class CheckpointStorageWriter(StorageWriter):
    """A DCP ``StorageWriter`` that writes one step of ``manager``'s checkpoints.

    Bound to one step: ``checkpoint_id`` is not accepted. A step that is
    already committed is refused on every rank before any shard is written,
    so a committed checkpoint's shards are never overwritten. Needs DCP's
    collectives (``use_collectives=False`` is refused): the coordinator must
    hold every rank's records to commit one manifest. After a save, the
    coordinator's ``manifest`` is the committed one; other ranks' is None.
    """

    def __init__(
        self,
        manager: CheckpointManager,
        step: int,
        *,
        metrics: Mapping[str, float] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.manager = manager
        self.step = step
        self.metrics = dict(metrics or {})
        self.meta = dict(meta or {})
        self.manifest: Manifest | None = None
        self.save_id = uuid.uuid4().hex

    def reset(self, checkpoint_id: Any = None) -> None:
        if checkpoint_id is not None:
            raise CheckpointError(
                f"this writer saves step {self.step} of {self.manager.uri}; "
                "it takes no checkpoint_id"
            )
        self.manifest = None
        self.save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("use_collectives", True) is False:
            raise CheckpointError(
                "a tideflow DCP checkpoint is committed by the coordinator with every rank's "
                "shards; use_collectives=False is not supported"
            )

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        if self.manager.store.exists(f"{step_prefix(self.step)}/{MANIFEST_NAME}"):
            raise CheckpointError(
                f"step {self.step} is already committed in {self.manager.uri}; "
                "a committed checkpoint is never replaced"
            )
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        # Names are fixed here, by the coordinator, so no two ranks can pick the same one.
        return [
            dataclasses.replace(plan, storage_data=f"__{rank}_0{DATA_SUFFIX}")
            for rank, plan in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> TorchFuture[list[WriteResult]]:
        name = plan.storage_data
        if not isinstance(name, str) or shard_name_problem(name):
            raise CheckpointError(f"step {self.step}: unusable shard name {name!r}")
        results: list[WriteResult] = []
        if plan.items:  # DCP writes replicated state once: some ranks may have nothing
            results = self._write_shard(name, plan, planner)
        future: TorchFuture[list[WriteResult]] = TorchFuture()
        future.set_result(results)
        return future

    def _write_shard(self, name: str, plan: SavePlan, planner: SavePlanner) -> list[WriteResult]:
        extents: list[tuple[MetadataIndex, _Extent]] = []
        with tempfile.TemporaryDirectory(prefix="tideflow-dcp-") as scratch:
            local = Path(scratch) / name
            with open(local, "wb") as handle:
                for item in plan.items:
                    offset = handle.tell()
                    data = planner.resolve_data(item)
                    if item.type == WriteItemType.BYTE_IO:
                        if not isinstance(data, io.BytesIO):
                            raise CheckpointError(f"{item.index.fqn}: expected bytes from DCP")
                        handle.write(data.getbuffer())
                    else:
                        if not isinstance(data, torch.Tensor):
                            raise CheckpointError(f"{item.index.fqn}: expected a tensor from DCP")
                        torch.save(_compact_cpu(data), handle)
                    extents.append((item.index, _Extent(name, offset, handle.tell() - offset)))
            # Uploaded from the file (multipart on S3) and hashed as it goes.
            record = self.manager.write_shard(self.step, name, local)
        return [
            WriteResult(
                index=index, size_in_bytes=extent.length, storage_data=_Written(extent, record)
            )
            for index, extent in extents
        ]

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        records: dict[str, ShardRecord] = {}
        extents: dict[MetadataIndex, _Extent] = {}
        for rank_results in results:
            for result in rank_results:
                written = result.storage_data
                if not isinstance(written, _Written):
                    raise CheckpointError(f"step {self.step}: a rank sent no shard record")
                known = records.setdefault(written.record.name, written.record)
                if known != written.record:
                    raise CheckpointError(
                        f"step {self.step}: shard {known.name} was reported twice, differently"
                    )
                extents[result.index] = written.extent
        metadata.storage_data = extents
        metadata.storage_meta = self.storage_meta()
        metadata.version = _DCP_VERSION
        records[METADATA_SHARD] = self.manager.write_shard(
            self.step, METADATA_SHARD, pickle.dumps(metadata)
        )
        meta = {
            **self.meta,
            "format": DCP_FORMAT,
            "world_size": len(results),
            "torch_version": torch.__version__,
        }
        # Last, and create-only: until this succeeds the step is not a checkpoint.
        self.manifest = self.manager.commit(
            self.step, list(records.values()), self.metrics, meta, world_size=None
        )

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(
            checkpoint_id=self.manager.store.url(step_prefix(self.step)), save_id=self.save_id
        )

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False  # never picked by DCP for a path: built from a manager


def _compact_cpu(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on the CPU, in storage of its own size (torch.save writes whole storages)."""
    tensor = tensor.detach().cpu()
    if tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
        tensor = tensor.clone()
    return tensor


# -- reading -------------------------------------------------------------------------------


_METADATA_CLASSES = {
    "Metadata",
    "MetadataIndex",
    "StorageMeta",
    "TensorStorageMetadata",
    "BytesStorageMetadata",
    "ChunkStorageMetadata",
    "TensorProperties",
    "_MEM_FORMAT_ENCODING",
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata and nothing else: no class outside an allow-list is built."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch.distributed.checkpoint.metadata" and name in _METADATA_CLASSES:
            return super().find_class(module, name)
        if module == __name__ and name == "_Extent":
            return _Extent
        if module == "torch":
            value = getattr(torch, name, None)
            if name == "Size" or isinstance(
                value, (torch.dtype, torch.layout, torch.memory_format)
            ):
                return value
        if module == "torch.serialization" and name == "_get_layout":  # how layouts pickle
            return super().find_class(module, name)
        if module == "collections" and name == "OrderedDict":
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP metadata")


class CheckpointStorageReader(StorageReader):
    """A DCP ``StorageReader`` for one committed DCP checkpoint of ``manager``.

    Built from a committed ``manifest`` (``manager.load`` / ``manager.latest``),
    so it never reads an uncommitted step. Each shard a rank needs is
    downloaded whole and checked against the manifest's SHA-256 and size
    before any item is taken from it (a rank that needs part of a shard still
    reads all of it: the checksum covers the whole shard); a damaged or
    missing shard raises ``CorruptCheckpointError`` naming it. Works at any
    world size: DCP plans which ranks read which parts.
    """

    def __init__(self, manager: CheckpointManager, manifest: Manifest) -> None:
        super().__init__()
        problems = dcp_problems(manifest)
        if problems:
            raise CheckpointError(f"checkpoint step {manifest.step}: {'; '.join(problems)}")
        self.manager = manager
        self.manifest = manifest
        self.load_id = uuid.uuid4().hex
        self._metadata: Metadata | None = None
        self._extents: dict[MetadataIndex, _Extent] = {}

    def reset(self, checkpoint_id: Any = None) -> None:
        if checkpoint_id is not None:
            raise CheckpointError(
                f"this reader reads step {self.manifest.step} of {self.manager.uri}; "
                "it takes no checkpoint_id"
            )
        self.load_id = uuid.uuid4().hex

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            raise CheckpointError("a tideflow DCP checkpoint has no rank-local metadata")
        if self._metadata is None:
            self._metadata = self._verified_metadata()
        if self._metadata.storage_meta is None:
            self._metadata.storage_meta = StorageMeta()
        self._metadata.storage_meta.load_id = self.load_id
        return self._metadata

    def _verified_metadata(self) -> Metadata:
        step = self.manifest.step
        data = self.manager.read_shard(self.manifest, METADATA_SHARD)  # checksum first
        try:
            metadata = _MetadataUnpickler(io.BytesIO(data)).load()
        except Exception as exc:
            raise CorruptCheckpointError(
                f"step {step}: shard {METADATA_SHARD} is not DCP metadata: {exc}"
            ) from exc
        if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
            raise CorruptCheckpointError(f"step {step}: shard {METADATA_SHARD} is not DCP metadata")
        listed = {record.name for record in self.manifest.shards}
        for extent in metadata.storage_data.values():
            if not isinstance(extent, _Extent) or extent.shard not in listed:
                raise CorruptCheckpointError(
                    f"step {step}: shard {METADATA_SHARD} points at {extent!r}, "
                    "which is not a shard of this checkpoint"
                )
        return metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        self._extents = dict(metadata.storage_data)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> TorchFuture[None]:
        by_shard: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            by_shard.setdefault(self._extents[item.storage_index].shard, []).append(item)
        with tempfile.TemporaryDirectory(prefix="tideflow-dcp-") as scratch:
            for name, items in sorted(by_shard.items()):
                local = Path(scratch) / name
                self._download(name, local)
                with open(local, "rb") as handle:
                    for item in items:
                        self._read_item(handle, item, planner)
                local.unlink()
        future: TorchFuture[None] = TorchFuture()
        future.set_result(None)
        return future

    def _download(self, name: str, local: Path) -> None:
        try:
            self.manager.download_shard(self.manifest, name, local)
        except CheckpointError:
            raise
        except Exception as exc:
            raise CorruptCheckpointError(
                f"step {self.manifest.step}: shard {name} cannot be read: {exc}"
            ) from exc

    def _read_item(self, handle: io.BufferedReader, item: ReadItem, planner: LoadPlanner) -> None:
        extent = self._extents[item.storage_index]
        handle.seek(extent.offset)
        data = handle.read(extent.length)
        where = f"step {self.manifest.step}: shard {extent.shard}, item {item.storage_index.fqn}"
        if len(data) != extent.length:
            raise CorruptCheckpointError(f"{where} is cut short")
        if item.type == LoadItemType.BYTE_IO:
            try:
                # DCP's planner unpickles these without restriction: check them first.
                torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
            except Exception as exc:
                raise CorruptCheckpointError(f"{where} is refused: {exc}") from exc
            planner.load_bytes(item, io.BytesIO(data))
            return
        tensor = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        for dim, (start, length) in enumerate(zip(item.storage_offsets, item.lengths, strict=True)):
            tensor = tensor.narrow(dim, start, length)
        target = planner.resolve_tensor(item).detach()
        if target.size() != tensor.size():
            raise CorruptCheckpointError(
                f"{where} has shape {tuple(tensor.size())}, expected {tuple(target.size())}"
            )
        target.copy_(tensor)
        planner.commit_tensor(item, target)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False


# -- the functions training code calls -----------------------------------------------------


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
