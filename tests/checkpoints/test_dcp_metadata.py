"""The extent class's name in DCP metadata is part of the checkpoint format.

Every DCP checkpoint's ``dcp.metadata`` pickles the extents of its items as
``tideflow.runtime.sharded._Extent``, where the class was first defined. A
save still names it so (a reader of an older tideflow accepts only that), a
load accepts it and the class's present module, and refuses any other class.
"""

from __future__ import annotations

import itertools
import pickle
import pickletools
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex

from tideflow.checkpoint import CheckpointManager, CorruptCheckpointError
from tideflow.checkpoint.manifest import step_prefix
from tideflow.runtime import dcp_format
from tideflow.runtime.dcp_format import DCP_FORMAT, METADATA_SHARD
from tideflow.runtime.sharded import load_sharded, save_sharded

OLD_PATH = "tideflow.runtime.sharded"


@dataclass(frozen=True)
class _Extent:
    """Not tideflow's: the same name and fields in another module."""

    shard: str
    offset: int
    length: int


def weights() -> dict[str, torch.Tensor]:
    return {"w": torch.arange(6.0).reshape(2, 3), "b": torch.tensor([7.0, 8.0])}


def extent_modules(manager: CheckpointManager, step: int) -> set[str]:
    """The modules checkpoint ``step``'s metadata names a class ``_Extent`` of."""
    data = manager.store.get_bytes(f"{step_prefix(step)}/{METADATA_SHARD}")
    strings = [arg for _, arg, _ in pickletools.genops(data) if isinstance(arg, str)]
    return {module for module, name in itertools.pairwise(strings) if name == "_Extent"}


def test_a_save_names_extents_by_their_first_module(tmp_path: Path) -> None:
    manager = CheckpointManager((tmp_path / "ckpt").as_uri())
    save_sharded(manager, 1, weights())
    assert extent_modules(manager, 1) == {OLD_PATH}


@pytest.mark.parametrize("module", [OLD_PATH, dcp_format.__name__])
def test_metadata_naming_either_extent_path_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str
) -> None:
    """The old path (every checkpoint written so far) and where the class lives now."""
    manager = CheckpointManager((tmp_path / "ckpt").as_uri())
    monkeypatch.setattr(dcp_format._Extent, "__module__", module)
    save_sharded(manager, 1, weights())
    assert extent_modules(manager, 1) == {module}
    monkeypatch.undo()

    state = {name: torch.zeros_like(tensor) for name, tensor in weights().items()}
    manifest = load_sharded(manager, state, step=1)
    assert manifest is not None and manifest.step == 1
    for name, tensor in weights().items():
        assert torch.equal(state[name], tensor)


def test_metadata_naming_another_class_is_refused(tmp_path: Path) -> None:
    manager = CheckpointManager((tmp_path / "ckpt").as_uri())
    impostor = Metadata(
        state_dict_metadata={}, storage_data={MetadataIndex("w"): _Extent("__0_0.distcp", 0, 8)}
    )
    manager.save(1, {METADATA_SHARD: pickle.dumps(impostor)}, meta={"format": DCP_FORMAT})
    with pytest.raises(
        CorruptCheckpointError,
        match=rf"shard {METADATA_SHARD} is not DCP metadata: "
        rf"{re.escape(__name__)}\._Extent is not part of DCP metadata",
    ):
        load_sharded(manager, {"w": torch.zeros(2)}, step=1)
