"""DCP's staging copies, reused from one save to the next where the installed torch can.

A save stages (copies) the state on the CPU so training may go on changing it.
Reusing one ``DefaultStager`` copies into the buffers of the previous save
instead of allocating and faulting in fresh memory each time. torch 2.11's
stager cannot stage a second time (``KeyError: <class 'type'>`` in its
deepcopy), so where the probe below fails every save gets a new stager.

Where the stager is reused, a state with CUDA tensors is staged into pinned
memory with non-blocking copies (DCP waits for the device before the save
returns): a copy into pageable memory runs at a fraction of the link's speed
and holds training several times longer. A CPU state keeps plain, unpinned
memory, and so does every state where each save needs a new stager (pinning
the whole state anew on every save would cost more than it saves).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.tensor import DTensor


def new_stager(*, pinned: bool = False) -> DefaultStager:
    # synchronous staging (the save returns with the copy complete), not shared memory
    return DefaultStager(
        StagingOptions(
            use_pinned_memory=pinned,
            use_shared_memory=False,
            use_async_staging=False,
            use_non_blocking_copy=pinned,
        )
    )


def holds_cuda_tensors(state: Any) -> bool:
    """Whether any tensor of a nested state (DTensors by their local shard) is on a GPU."""
    if isinstance(state, DTensor):
        return state.to_local().device.type == "cuda"
    if isinstance(state, torch.Tensor):
        return state.device.type == "cuda"
    if isinstance(state, dict):
        return any(holds_cuda_tensors(value) for value in state.values())
    if isinstance(state, (list, tuple)):
        return any(holds_cuda_tensors(value) for value in state)
    return False


@functools.cache
def stager_reusable() -> bool:
    """Whether one stager can stage twice with the installed torch (probed once)."""
    probe = new_stager()
    try:
        for _ in range(2):
            probe.stage({"probe": torch.zeros(2)})
    except KeyError:
        return False
    finally:
        probe.close()
    return True


class Stagers:
    """The stager for the next save: the same one every time where torch can reuse it."""

    def __init__(self) -> None:
        self._kept: dict[bool, DefaultStager] = {}

    def next(self, state: Any = None) -> DefaultStager:
        """A stager for ``state``: pinned with non-blocking copies if it holds CUDA tensors."""
        if not stager_reusable():
            # a stager made per save would allocate and pin the whole state each time
            return new_stager()
        pinned = holds_cuda_tensors(state) and torch.cuda.is_available()
        if pinned not in self._kept:
            self._kept[pinned] = new_stager(pinned=pinned)
        return self._kept[pinned]
