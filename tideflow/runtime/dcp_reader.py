"""A DCP ``StorageReader`` for one committed checkpoint of a ``CheckpointManager``.

Every shard is checked against the manifest before any byte of it is used,
and DCP's metadata is unpickled with an allow-list of its own classes
(``tideflow.runtime.sharded`` documents the whole protocol).
"""

from __future__ import annotations

import io
import pickle
import tempfile
import uuid
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future as TorchFuture

from tideflow.checkpoint import (
    CheckpointError,
    CheckpointManager,
    CorruptCheckpointError,
    Manifest,
)
from tideflow.runtime import dcp_format
from tideflow.runtime.dcp_format import EXTENT_PICKLED_MODULE, METADATA_SHARD, _Extent, dcp_problems

__all__ = ["CheckpointStorageReader"]


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

# The name every checkpoint's metadata gives the extent class, and the module that
# defines it now (what a pickle of it would name were its pickled name not kept).
_EXTENT_NAMES = {(EXTENT_PICKLED_MODULE, "_Extent"), (dcp_format.__name__, "_Extent")}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata and nothing else: no class outside an allow-list is built."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch.distributed.checkpoint.metadata" and name in _METADATA_CLASSES:
            return super().find_class(module, name)
        if (module, name) in _EXTENT_NAMES:
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
