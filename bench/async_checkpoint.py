"""Training stall of an async checkpoint versus a synchronous save of the same state.

    .venv/bin/python bench/async_checkpoint.py [--size-mb 1024] [--repeat 3]

The state is a few large float32 tensors (like a model plus optimizer
moments). Synchronous: serialise, hash, write and commit before training goes
on. Async (tideflow.runtime.AsyncCheckpointer): training waits only for the
copy into reused CPU buffers; the rest happens in a background thread. The
first async save allocates its buffers; later saves reuse them, as a training
run does, so the figure reported is the median stall of saves 2..N.

The same state is also saved through ``tideflow.checkpoints()`` (what a plain
script calls): its ``save`` adds building the state dicts, the RNG states and
the agreement between ranks to the copy. Its cost on steps where nothing is
saved (one all-reduce of three flags between two gloo ranks) is measured too.

``bench/gpu_checkpoint_staging.py`` times the same loops on a GPU state; it
imports them from here.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tideflow.checkpoint import CheckpointManager
from tideflow.runtime import AsyncCheckpointer, DistInfo

TARGET = 0.03


def make_state(size_mb: int) -> dict[str, torch.Tensor]:
    per_tensor = size_mb * 1024 * 1024 // 4 // 4  # four float32 tensors
    return {f"tensor_{i}": torch.randn(per_tensor) for i in range(4)}


def sync_save(manager: CheckpointManager, step: int, state: dict[str, torch.Tensor]) -> float:
    started = time.perf_counter()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    manager.save(step, {"model.pt": buffer.getvalue()})
    return time.perf_counter() - started


class _Holder:
    """The benchmark's state as a stateful object, as a model is to tideflow.checkpoints()."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.state = state


def async_stalls(
    checkpointer: AsyncCheckpointer,
    state: dict[str, torch.Tensor],
    saves: int,
    settle: Callable[[], None] = lambda: None,
) -> list[float]:
    """Each ``AsyncCheckpointer.save`` stall; the write finishes before the next save, as
    training's steps would give it time. ``settle`` runs, untimed, before each save."""
    for step in range(saves):
        settle()
        checkpointer.save(step, state, rank_state={"rng": torch.get_rng_state()})
        checkpointer.wait()
    checkpointer.finalize()
    return checkpointer.stall_seconds


def api_stalls(
    uri: str,
    state: dict[str, torch.Tensor],
    saves: int,
    prepare: Callable[[AsyncCheckpointer], None] | None = None,
    settle: Callable[[], None] = lambda: None,
) -> list[float]:
    """How long each due ``tideflow.checkpoints().save`` holds the training loop;
    ``prepare`` adjusts its checkpointer first, ``settle`` runs untimed before each save."""
    import tideflow

    os.environ.update({"TIDEFLOW_CHECKPOINT_URI": uri, "TIDEFLOW_KEEP_LAST": "1"})
    ckpt = tideflow.checkpoints(model=_Holder(state), every_steps=1)
    assert ckpt.checkpointer is not None
    if prepare is not None:
        prepare(ckpt.checkpointer)
    stalls = []
    for step in range(1, saves + 1):
        settle()
        started = time.perf_counter()
        ckpt.save(step, metrics={"loss": 1.0})
        stalls.append(time.perf_counter() - started)
        ckpt.checkpointer.wait()  # training goes on meanwhile, as in async_stalls
    ckpt.finish(saves)
    return stalls


def _agreement_worker(rank: int, port: int, calls: int, out: Any) -> None:
    import torch.distributed as dist

    import tideflow

    os.environ.update(
        {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    )
    os.environ.pop("TIDEFLOW_CHECKPOINT_URI", None)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    ckpt = tideflow.checkpoints(model=torch.nn.Linear(4, 4), every_steps=10**9)
    for step in range(1, 51):  # warm up the group
        ckpt.save(step)
    started = time.perf_counter()
    for step in range(51, 51 + calls):
        ckpt.save(step, metrics={"loss": 1.0})
    if rank == 0:
        out.put((time.perf_counter() - started) / calls)
    dist.destroy_process_group()


def agreement_cost(calls: int = 2000) -> float:
    """Seconds one save() on a step with nothing to save costs, between two gloo ranks."""
    import torch.multiprocessing as mp

    from tideflow.backends.local_supervisor import free_port

    context = mp.get_context("spawn")
    out = context.SimpleQueue()
    port = free_port()
    workers = [
        context.Process(target=_agreement_worker, args=(rank, port, calls, out)) for rank in (0, 1)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return float(out.get())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    state = make_state(args.size_mb)
    info = DistInfo(0, 1, 0, torch.device("cpu"), None, False)
    with tempfile.TemporaryDirectory(prefix="tideflow-bench-") as scratch:
        sync_manager = CheckpointManager(Path(scratch, "sync").as_uri(), keep_last=1)
        sync_times = []
        for step in range(args.repeat):
            sync_times.append(sync_save(sync_manager, step, state))
            sync_manager.apply_retention()
        async_manager = CheckpointManager(Path(scratch, "async").as_uri(), keep_last=1)
        checkpointer = AsyncCheckpointer(async_manager, info)
        stalls = async_stalls(checkpointer, state, args.repeat + 1)[1:]
        api = api_stalls(Path(scratch, "api").as_uri(), state, args.repeat + 1)
    sync = statistics.median(sync_times)
    stall = statistics.median(stalls)
    api_stall = statistics.median(api[1:])
    per_step = agreement_cost()
    result = {
        "state_mb": args.size_mb,
        "sync_save_s": round(sync, 3),
        "async_stall_s": round(stall, 4),
        "first_async_stall_s": round(checkpointer.stall_seconds[0], 4),
        "ratio": round(stall / sync, 4),
        "target_met": stall / sync <= TARGET,
        "api_stall_s": round(api_stall, 4),
        "api_ratio": round(api_stall / sync, 4),
        "api_target_met": api_stall / sync <= TARGET,
        "api_step_without_save_us": round(per_step * 1e6, 1),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.size_mb} MB state, median of {args.repeat}")
        print(f"  synchronous save        {sync:.3f} s")
        print(
            f"  async stall (reused)    {stall * 1000:.1f} ms "
            f"(first save, allocating buffers: {checkpointer.stall_seconds[0] * 1000:.1f} ms)"
        )
        print(
            f"  stall / sync            {stall / sync:.2%}  (target <= {TARGET:.0%}: "
            f"{'met' if result['target_met'] else 'MISSED'})"
        )
        print(f"  tideflow.checkpoints().save, stall  {api_stall * 1000:.1f} ms")
        print(
            f"  its stall / sync        {api_stall / sync:.2%}  (target <= {TARGET:.0%}: "
            f"{'met' if result['api_target_met'] else 'MISSED'})"
        )
        print(f"  save() on a step with nothing to save (2 gloo ranks): {per_step * 1e6:.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
