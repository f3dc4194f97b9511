"""The layout of a tideflow DCP checkpoint: its format name, its shards, where items lie.

Shared by the storage writer (``tideflow.runtime.dcp_writer``), the storage
reader (``tideflow.runtime.dcp_reader``) and the save/load functions training
code calls (``tideflow.runtime.sharded``, which documents the whole protocol).
"""

from __future__ import annotations

from dataclasses import dataclass

from tideflow.checkpoint import Manifest

DCP_FORMAT = "torch-dcp"
METADATA_SHARD = "dcp.metadata"
DATA_SUFFIX = ".distcp"
# DCP's own metadata version for the layout written here (one file per rank,
# tensors saved with torch.save at recorded offsets).
DCP_VERSION = "1.0.0"
# Where the pickled metadata of every checkpoint names the extent class: the module
# that defined it when the format was made. The name is part of the format (older
# readers accept only it), so it stays although the class now lives here.
EXTENT_PICKLED_MODULE = "tideflow.runtime.sharded"

__all__ = [
    "DATA_SUFFIX",
    "DCP_FORMAT",
    "DCP_VERSION",
    "EXTENT_PICKLED_MODULE",
    "METADATA_SHARD",
    "dcp_problems",
]


@dataclass(frozen=True)
class _Extent:
    """Where one saved item lies: its shard, and the byte range inside it."""

    shard: str
    offset: int
    length: int


# pickle writes a class by its __module__ (and checks that module holds it there).
_Extent.__module__ = EXTENT_PICKLED_MODULE


def dcp_problems(manifest: Manifest) -> list[str]:
    """Why ``manifest`` is not a DCP checkpoint tideflow can load; empty if it is."""
    if manifest.meta.get("format") != DCP_FORMAT:
        return [
            f"it is not a {DCP_FORMAT} checkpoint (meta format {manifest.meta.get('format')!r})"
        ]
    if METADATA_SHARD not in {record.name for record in manifest.shards}:
        return [f"it has no shard {METADATA_SHARD}"]
    return []
