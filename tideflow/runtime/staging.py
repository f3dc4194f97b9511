"""DCP's staging copies, reused from one save to the next where the installed torch can.

A save stages (copies) the state on the CPU so training may go on changing it.
Reusing one ``DefaultStager`` copies into the buffers of the previous save
instead of allocating and faulting in fresh memory each time. torch 2.11's
stager cannot stage a second time (``KeyError: <class 'type'>`` in its
deepcopy), so where the probe below fails every save gets a new stager.
"""

from __future__ import annotations

import functools

import torch
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions


def new_stager() -> DefaultStager:
    # synchronous staging into plain (not pinned, not shared) CPU memory
    return DefaultStager(StagingOptions(False, False, False, False))


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
        self._kept: DefaultStager | None = None

    def next(self) -> DefaultStager:
        if not stager_reusable():
            return new_stager()
        if self._kept is None:
            self._kept = new_stager()
        return self._kept
