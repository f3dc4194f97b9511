"""A DCP ``StorageWriter`` that saves one step of a ``CheckpointManager``'s checkpoints.

Every file DCP asks for becomes a checksummed shard of the step; the
coordinator commits one manifest listing every rank's shards, last
(``tideflow.runtime.sharded`` documents the whole protocol).
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future as TorchFuture

from tideflow.checkpoint import CheckpointError, CheckpointManager, Manifest, ShardRecord
from tideflow.checkpoint.manifest import MANIFEST_NAME, shard_name_problem, step_prefix
from tideflow.runtime.dcp_format import (
    DATA_SUFFIX,
    DCP_FORMAT,
    DCP_VERSION,
    METADATA_SHARD,
    _Extent,
)

__all__ = ["CheckpointStorageWriter"]


@dataclass(frozen=True)
class _Written:
    """A rank's account of one item it wrote: where, and the record of the shard holding it."""

    extent: _Extent
    record: ShardRecord


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
        metadata.version = DCP_VERSION
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
