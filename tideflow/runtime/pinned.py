"""Host copies of a training state for an asynchronous save, pinned where it lives on a GPU.

An asynchronous save holds the training loop only while the state is copied
to host memory; the background writer then reads that copy. Copying a CUDA
tensor into ordinary (pageable) memory runs at a fraction of the link's speed
(the driver bounces it through its own pinned buffer), so for a large state
the copy dominates the stall. Here a CUDA tensor is copied instead:

* into a **pinned** host buffer, allocated on the first save and reused by
  every later one whose tensor at the same place has the same shape, dtype and
  device kind (a changed tensor gets a new buffer; one no longer in the state
  is released), since allocating pinned memory costs far more than copying;
* with ``non_blocking=True`` on a **dedicated stream** per device, which first
  waits for the training stream, so the copy sees every step queued before the
  save;
* and the call returns only after an **event** recorded behind the copies has
  completed: the writer thread may read the buffers, and training may change
  the source tensors (or free them) at once.

CPU tensors are copied synchronously into plain CPU buffers, as before.

The buffers belong to one save at a time: the caller must not copy again
until the previous save's writer has finished reading them (``AsyncCheckpointer``
waits for it first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class BufferLayout:
    """What a host buffer must match to be reused for a tensor."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    pinned: bool

    @classmethod
    def of(cls, source: torch.Tensor) -> BufferLayout:
        return cls(tuple(source.shape), source.dtype, source.device.type == "cuda")


@dataclass
class _Buffer:
    tensor: torch.Tensor
    layout: BufferLayout


def _allocate(source: torch.Tensor, layout: BufferLayout) -> torch.Tensor:
    # empty_like keeps the source's strides (channels_last stays so in the checkpoint)
    return torch.empty_like(source, device="cpu", pin_memory=layout.pinned)


class HostSnapshot:
    """Reusable host copies of a nested state (dicts, lists, tuples of tensors and values)."""

    def __init__(self) -> None:
        # keyed by where a tensor sits in the state: its keys and indices from the top
        self.buffers: dict[tuple[Any, ...], _Buffer] = {}
        self.allocations = 0  # buffers allocated so far: a steady state allocates none
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._device_copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._used: set[tuple[Any, ...]] = set()

    def copy(self, state: Any) -> Any:
        """The state with every tensor replaced by its host copy, complete on return."""
        self._device_copies, self._used = [], set()
        try:
            staged = self._stage(state, ())
            self._copy_from_devices()
        finally:
            self._device_copies = []
        for path in set(self.buffers) - self._used:
            del self.buffers[path]  # the state no longer has it: do not hold its memory
        return staged

    def _stage(self, obj: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(obj, torch.Tensor):
            source = obj.detach()
            buffer = self._buffer(path, source)
            if source.device.type == "cuda":
                self._device_copies.append((buffer, source))
            else:
                buffer.copy_(source)
            return buffer
        if isinstance(obj, dict):
            return {k: self._stage(v, (*path, k)) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._stage(v, (*path, i)) for i, v in enumerate(obj))
        return obj

    def _buffer(self, path: tuple[Any, ...], source: torch.Tensor) -> torch.Tensor:
        self._used.add(path)
        layout = BufferLayout.of(source)
        kept = self.buffers.get(path)
        if kept is None or kept.layout != layout:
            kept = _Buffer(_allocate(source, layout), layout)
            self.buffers[path] = kept
            self.allocations += 1
        return kept.tensor

    def _copy_from_devices(self) -> None:
        by_device: dict[torch.device, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for buffer, source in self._device_copies:
            by_device.setdefault(source.device, []).append((buffer, source))
        done = []
        for device, copies in by_device.items():
            stream = self._stream(device)
            # the copies must see what the steps queued on the training stream produce
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for buffer, source in copies:
                    buffer.copy_(source, non_blocking=True)
                done.append(stream.record_event())
        for event in done:
            # after this the writer may read the buffers and training may change the sources
            event.synchronize()

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        return self._streams[device]
