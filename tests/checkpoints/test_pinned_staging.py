"""Host copies for asynchronous saves: reused by layout, pinned for CUDA tensors.

The CPU tests hold the logic every machine runs (buffer reuse, reallocation,
the writer's ownership of the buffers, CPU states copied as before). The GPU
tests save a CUDA state, change it the moment ``save`` returns, and check the
checkpoint holds the values at the call, bit for bit; they skip without CUDA.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tideflow.checkpoint import CheckpointManager
from tideflow.checkpoint.manifest import MODEL_SHARD
from tideflow.runtime import AsyncCheckpointer, DistInfo
from tideflow.runtime import checkpointing as checkpointing_module
from tideflow.runtime.pinned import BufferLayout, HostSnapshot
from tideflow.runtime.staging import Stagers, holds_cuda_tensors, stager_reusable

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
ONE_PROCESS = DistInfo(0, 1, 0, torch.device("cpu"), None, False)


def model_state(device: str = "cpu", dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(0)
    return {
        "model": {
            "weight": torch.randn(64, 32, generator=generator).to(device, dtype),
            "bias": torch.randn(32, generator=generator).to(device, dtype),
        },
        "optimizer": {"state": [torch.zeros(64, 32).to(device, dtype)], "lr": 0.1},
        "step": 7,
    }


def read_model_shard(manager: CheckpointManager, step: int) -> Any:
    data = manager.read_shard(manager.load(step), MODEL_SHARD)
    return checkpointing_module._load(data)


# -- buffer reuse --------------------------------------------------------------------------


def test_buffers_are_allocated_once_and_reused_while_the_layout_stays() -> None:
    snapshot, state = HostSnapshot(), model_state()
    first = snapshot.copy(state)
    state["model"]["weight"].add_(1)
    second = snapshot.copy(state)
    assert snapshot.allocations == 3
    assert second["model"]["weight"] is first["model"]["weight"]
    assert second["optimizer"]["state"][0] is first["optimizer"]["state"][0]
    assert torch.equal(second["model"]["weight"], state["model"]["weight"])


def test_a_tensor_whose_shape_or_dtype_changed_gets_a_new_buffer_and_the_rest_are_kept() -> None:
    snapshot, state = HostSnapshot(), model_state()
    first = snapshot.copy(state)
    state["model"]["weight"] = torch.ones(16, 32)
    state["model"]["bias"] = state["model"]["bias"].double()
    second = snapshot.copy(state)
    assert snapshot.allocations == 5
    assert second["model"]["weight"] is not first["model"]["weight"]
    assert second["model"]["weight"].shape == (16, 32)
    assert second["model"]["bias"].dtype == torch.float64
    assert second["optimizer"]["state"][0] is first["optimizer"]["state"][0]
    weight_layout = snapshot.buffers[("model", "weight")].layout
    assert weight_layout == BufferLayout((16, 32), torch.float32, pinned=False)


def test_a_tensor_no_longer_in_the_state_releases_its_buffer() -> None:
    snapshot, state = HostSnapshot(), model_state()
    snapshot.copy(state)
    del state["optimizer"]
    snapshot.copy(state)
    assert set(snapshot.buffers) == {("model", "weight"), ("model", "bias")}


# -- CPU states ----------------------------------------------------------------------------


def test_a_cpu_state_is_copied_unpinned_keeping_structure_values_and_strides() -> None:
    state = model_state()
    state["image"] = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    state["pair"] = (torch.arange(3), "label")
    snapshot = HostSnapshot()
    staged = snapshot.copy(state)
    state["model"]["weight"].zero_()
    assert not holds_cuda_tensors(state)
    assert staged["step"] == 7 and staged["optimizer"]["lr"] == 0.1
    assert isinstance(staged["pair"], tuple) and staged["pair"][1] == "label"
    assert staged["image"].stride() == state["image"].stride()
    assert torch.equal(staged["model"]["weight"], model_state()["model"]["weight"])
    assert snapshot.buffers and all(not kept.layout.pinned for kept in snapshot.buffers.values())


def test_the_next_save_waits_for_the_writer_that_still_reads_the_buffers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Save 2 must not copy into the buffers save 1's writer has not read yet."""
    manager = CheckpointManager((tmp_path / "ckpt").as_uri())
    checkpointer = AsyncCheckpointer(manager, ONE_PROCESS)
    release, serialise = threading.Event(), checkpointing_module._serialise

    def slow_serialise(obj: Any) -> bytes:
        assert release.wait(30)  # the writer of save 1 has not read the copy yet
        return serialise(obj)

    monkeypatch.setattr(checkpointing_module, "_serialise", slow_serialise)
    state = {"weight": torch.zeros(1024)}
    checkpointer.save(1, state, rank_state={})
    state["weight"].fill_(2.0)  # training goes on
    second = threading.Thread(target=lambda: checkpointer.save(2, state, rank_state={}))
    second.start()
    time.sleep(0.3)
    assert second.is_alive(), "save 2 returned while save 1's writer still owned the buffers"
    release.set()
    second.join(30)
    checkpointer.finalize()
    assert torch.equal(read_model_shard(manager, 1)["weight"], torch.zeros(1024))
    assert torch.equal(read_model_shard(manager, 2)["weight"], torch.full((1024,), 2.0))


def test_a_sharded_save_of_a_cpu_state_keeps_unpinned_blocking_staging() -> None:
    stagers, state = Stagers(), model_state()
    stager = stagers.next(state)
    assert not holds_cuda_tensors(state)
    assert not stager._config.use_pinned_memory and not stager._config.use_non_blocking_copy
    assert (stagers.next(state) is stager) == stager_reusable()


# -- on a GPU ------------------------------------------------------------------------------


@needs_cuda
@pytest.mark.timeout(120)
def test_an_async_save_of_a_cuda_state_holds_its_values_at_the_call(tmp_path: Path) -> None:
    manager = CheckpointManager((tmp_path / "ckpt").as_uri())
    checkpointer = AsyncCheckpointer(manager, ONE_PROCESS)
    weight = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    state = {"model": {"weight": weight}, "step": 1}
    for step in (1, 2):
        weight.mul_(1.5).add_(weight @ weight)  # queued work the copy must wait for
        expected = weight.clone()
        checkpointer.save(step, state, rank_state={})
        weight.add_(1.0)  # at once, before the writer has run
        checkpointer.wait()
        saved = read_model_shard(manager, step)["model"]["weight"]
        assert saved.dtype == torch.bfloat16
        assert torch.equal(saved.view(torch.int16), expected.cpu().view(torch.int16))
    buffer = checkpointer._snapshots[0].buffers[("model", "weight")]
    assert buffer.layout.pinned and buffer.tensor.is_pinned()
    assert checkpointer._snapshots[0].allocations == 1  # the second save reused it


@needs_cuda
@pytest.mark.timeout(180)
def test_a_sharded_async_save_on_one_nccl_rank_holds_the_state_at_its_call(
    tmp_path: Path,
) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from tideflow.runtime.sharded import _background, async_save_sharded, load_sharded

    if not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL")
    torch.cuda.set_device(0)
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cuda", (1,))
        full = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16)
        state = {"model": {"sharded": distribute_tensor(full, mesh, [Shard(0)]), "plain": full}}
        assert holds_cuda_tensors(state)
        manager = CheckpointManager((tmp_path / "ckpt").as_uri())
        expected = full.clone()
        save = async_save_sharded(manager, 1, state)
        full.add_(1.0)  # at once; both entries change, whether or not they share memory
        state["model"]["sharded"].to_local().add_(1.0)
        assert save.result() is not None
        if stager_reusable():  # else each save gets a new, unpinned stager
            assert _background.stagers.next(state)._config.use_pinned_memory
        loaded = {
            "model": {
                "sharded": distribute_tensor(torch.zeros_like(full), mesh, [Shard(0)]),
                "plain": torch.zeros_like(full),
            }
        }
        load_sharded(manager, loaded, step=1)
        for value in (loaded["model"]["sharded"].full_tensor(), loaded["model"]["plain"]):
            assert torch.equal(value.view(torch.int16), expected.view(torch.int16))
    finally:
        dist.destroy_process_group()
