"""When a resumed DDP run can differ from an uninterrupted one, and why.

DDP sums each gradient bucket across ranks. A new DDP reduces its first step in
its initial bucket layout (parameters in definition order) and then rebuilds
the buckets in the order gradients became ready, which it keeps. An
uninterrupted run therefore uses the initial layout at step 1 only; a resumed
run uses it again at its first step. A different layout puts a gradient in a
different chunk of the collective, so its addends are summed in another order.
Two addends sum to the same float in either order, so 2-rank gangs resume
bitwise; with 3 or more ranks that one step can round differently in the last
bits (measured: up to 6e-8 in the weights of tests/user_code/plain_ddp.py with
4 gloo ranks). DDP never rebuilds its buckets with
``find_unused_parameters=True`` (and no ``static_graph``), so such a model
resumes bitwise at any world size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def rebuilds_buckets(model: Any) -> bool:
    """Whether ``model`` is a DDP that will re-lay its gradient buckets after step 1."""
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return False
    return bool(model.static_graph or not model.find_unused_parameters)


def resume_caveat(stateful: Mapping[str, Any], world_size: int) -> str | None:
    """The line a resumed run logs when it may not be bitwise equal to an uninterrupted one."""
    if world_size <= 2:
        return None
    names = sorted(name for name, obj in stateful.items() if rebuilds_buckets(obj))
    if not names:
        return None
    return (
        f"{', '.join(names)}: DDP reduces the first step after a restart in its initial "
        f"bucket layout; with {world_size} ranks the result may differ from an "
        "uninterrupted run in the last bits. For a bitwise resume construct the "
        "DistributedDataParallel with find_unused_parameters=True"
    )
