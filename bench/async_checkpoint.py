"""Training stall of an async checkpoint versus a synchronous save of the same state.

    .venv/bin/python bench/async_checkpoint.py [--size-mb 1024] [--repeat 3]

The state is a few large float32 tensors (like a model plus optimizer
moments). Synchronous: serialise, hash, write and commit before training goes
on. Async (tideflow.runtime.AsyncCheckpointer): training waits only for the
copy into reused CPU buffers; the rest happens in a background thread. The
first async save allocates its buffers; later saves reuse them, as a training
run does, so the figure reported is the median stall of saves 2..N.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

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
        for step in range(args.repeat + 1):
            checkpointer.save(step, state, rank_state={"rng": torch.get_rng_state()})
            # training goes on meanwhile; give the writer time as steps would
            checkpointer.wait()
        checkpointer.finalize()
        stalls = checkpointer.stall_seconds[1:]
    sync = statistics.median(sync_times)
    stall = statistics.median(stalls)
    result = {
        "state_mb": args.size_mb,
        "sync_save_s": round(sync, 3),
        "async_stall_s": round(stall, 4),
        "first_async_stall_s": round(checkpointer.stall_seconds[0], 4),
        "ratio": round(stall / sync, 4),
        "target_met": stall / sync <= TARGET,
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
