"""Training stall and step slowdown of an async checkpoint of a GPU state: pageable vs pinned.

    .venv/bin/python bench/gpu_checkpoint_staging.py [--size-mb 2048] [--repeat 3] [--json]
    .venv/bin/python bench/gpu_checkpoint_staging.py --cpu-smoke   # proves the script runs

The state is bf16 tensors on the GPU (like a model plus optimizer moments).
Measured in one run, on one GPU:

* the synchronous save (serialise, hash, write, commit) of the state;
* the stall of an async save (how long ``save`` holds the loop until training
  may go on) through ``AsyncCheckpointer`` and ``tideflow.checkpoints().save``,
  once with the staging before pinned buffers (a blocking copy into pageable
  host memory, reproduced here as the baseline) and once with today's pinned
  staging; median of saves 2..N (the first one allocates the buffers);
* the step time of a matmul loop timed with CUDA events, alone and while the
  background write of a checkpoint is in flight (their ratio: the slowdown);
* how long the write keeps another Python thread waiting for the GIL (its
  longest hold), a lead on where a slowdown comes from.

Targets: stall at most 1% of the synchronous save; slowdown at most 1.03x.
Without a CUDA device it prints that it needs one and exits 0; ``--cpu-smoke``
runs every path on a small CPU state instead (no GPU figure comes of it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import async_checkpoint  # bench/, beside this script: the loops it times
import torch

from tideflow.checkpoint import CheckpointManager
from tideflow.runtime import AsyncCheckpointer, DistInfo

STALL_TARGET = 0.01
SLOWDOWN_TARGET = 1.03
COLUMNS = 8192  # of each state tensor: 16 KiB a row in bf16
WRITE_TIMEOUT_S = 600


class PageableSnapshot:
    """The staging before pinned buffers: a blocking copy into reused pageable memory."""

    def __init__(self) -> None:
        self.buffers: dict[str, torch.Tensor] = {}

    def copy(self, obj: Any, path: str = "") -> Any:
        if isinstance(obj, torch.Tensor):
            source = obj.detach()
            buffer = self.buffers.get(path)
            if buffer is None or buffer.shape != source.shape or buffer.dtype != source.dtype:
                buffer = torch.empty_like(source, device="cpu")
                self.buffers[path] = buffer
            buffer.copy_(source)
            return buffer
        if isinstance(obj, dict):
            return {k: self.copy(v, f"{path}/{k}") for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.copy(v, f"{path}/{i}") for i, v in enumerate(obj))
        return obj


def make_state(size_mb: int, device: torch.device) -> dict[str, torch.Tensor]:
    """bf16 tensors of 64 MiB (the last one smaller) adding up to ``size_mb``."""
    rows_left = size_mb * 1024 * 1024 // (2 * COLUMNS)
    state, index = {}, 0
    while rows_left > 0:
        rows = min(rows_left, 4096)
        state[f"tensor_{index}"] = torch.randn(rows, COLUMNS, device=device, dtype=torch.bfloat16)
        rows_left -= rows
        index += 1
    return state


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sync_save(manager: CheckpointManager, step: int, state: dict[str, torch.Tensor]) -> float:
    synchronize(next(iter(state.values())).device)
    elapsed = async_checkpoint.sync_save(manager, step, state)
    manager.apply_retention()
    return elapsed


def use_pageable(checkpointer: AsyncCheckpointer) -> None:
    checkpointer._snapshots = (PageableSnapshot(), PageableSnapshot())  # type: ignore[assignment]


def async_stalls(
    uri: str, state: dict[str, torch.Tensor], saves: int, pageable: bool
) -> list[float]:
    """Each ``AsyncCheckpointer.save`` stall; the write finishes before the next save."""
    checkpointer = AsyncCheckpointer(CheckpointManager(uri, keep_last=1), one_process())
    if pageable:
        use_pageable(checkpointer)
    device = next(iter(state.values())).device
    # the steps queued before a save are not the save's to pay for
    return async_checkpoint.async_stalls(checkpointer, state, saves, lambda: synchronize(device))


def api_stalls(uri: str, state: dict[str, torch.Tensor], saves: int, pageable: bool) -> list[float]:
    """How long each due ``tideflow.checkpoints().save`` holds the training loop."""
    device = next(iter(state.values())).device
    return async_checkpoint.api_stalls(
        uri, state, saves, use_pageable if pageable else None, lambda: synchronize(device)
    )


def one_process() -> DistInfo:
    return DistInfo(0, 1, 0, torch.device("cpu"), None, False)


def step_function(device: torch.device, width: int, layers: int) -> Callable[[], None]:
    """One training-like step: ``layers`` matmuls and activations, ending in a host sync."""
    weight = torch.randn(width, width, device=device, dtype=torch.bfloat16) / width**0.5
    inputs = torch.randn(width, width, device=device, dtype=torch.bfloat16)

    def step() -> None:
        x = inputs
        for _ in range(layers):
            x = torch.tanh(x @ weight)
        x.float().sum().item()  # as a loop reading its loss does

    return step


def time_step(step: Callable[[], None], device: torch.device) -> float:
    """Seconds one step takes: CUDA events on a GPU (device time), the wall clock on a CPU."""
    if device.type != "cuda":
        started = time.perf_counter()
        step()
        return time.perf_counter() - started
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    step()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000


def writer_host_holds(uri: str, state: dict[str, torch.Tensor]) -> dict[str, float]:
    """How long the background write keeps another Python thread from running (the GIL).

    A thread that wakes every millisecond records its longest wait and the time
    lost in waits over 5 ms during one write (after a first that allocates). A
    training loop launches its kernels from such a thread: long holds can leave
    the GPU idle, which is one way a write slows the steps.
    """
    written = threading.Event()
    checkpointer = AsyncCheckpointer(
        CheckpointManager(uri, keep_last=1), one_process(), on_commit=lambda _: written.set()
    )
    checkpointer.save(0, state, rank_state={}, block=True)
    gaps: list[float] = []
    written.clear()
    checkpointer.save(1, state, rank_state={})
    last = time.perf_counter()
    while not written.is_set():
        time.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last - 0.001)
        last = now
    checkpointer.finalize()
    return {
        "writer_longest_hold_ms": round(max(gaps, default=0.0) * 1000, 1),
        "writer_held_over_5ms_total_ms": round(sum(g for g in gaps if g > 0.005) * 1000, 1),
    }


def steps_during_writes(
    uri: str, state: dict[str, torch.Tensor], step: Callable[[], None], writes: int, pageable: bool
) -> list[float]:
    """Step times while an async save's background write is in flight."""
    written = threading.Event()
    checkpointer = AsyncCheckpointer(
        CheckpointManager(uri, keep_last=1), one_process(), on_commit=lambda _: written.set()
    )
    if pageable:
        use_pageable(checkpointer)
    device = next(iter(state.values())).device
    times: list[float] = []
    for index in range(writes + 1):
        written.clear()
        checkpointer.save(index, state, rank_state={})
        deadline = time.monotonic() + WRITE_TIMEOUT_S
        while True:  # at least one step, however fast the write
            duration = time_step(step, device)
            if index > 0:  # the first write allocates its buffers
                times.append(duration)
            if written.is_set() or time.monotonic() > deadline:
                break
        checkpointer.wait()
    checkpointer.finalize()
    return times


def median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 3)


def measure_mode(
    scratch: str, state: dict[str, torch.Tensor], args: argparse.Namespace, pageable: bool
) -> dict[str, Any]:
    name = "pageable" if pageable else "pinned"
    stalls = async_stalls(Path(scratch, f"{name}-async").as_uri(), state, args.repeat + 1, pageable)
    api = api_stalls(Path(scratch, f"{name}-api").as_uri(), state, args.repeat + 1, pageable)
    return {
        "async_stall_ms": median_ms(stalls[1:]),
        "first_async_stall_ms": round(stalls[0] * 1000, 3),
        "api_stall_ms": median_ms(api[1:]),
    }


def measure(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    state = make_state(args.size_mb, device)
    step = step_function(device, args.width, args.layers)
    for _ in range(5):  # warm up kernels and clocks
        time_step(step, device)
    result: dict[str, Any] = {"state_mb": args.size_mb, "tensors": len(state)}
    with tempfile.TemporaryDirectory(prefix="tideflow-bench-", dir=args.scratch) as scratch:
        sync_manager = CheckpointManager(Path(scratch, "sync").as_uri(), keep_last=1)
        sync = [sync_save(sync_manager, index, state) for index in range(args.repeat)]
        result["sync_save_s"] = round(statistics.median(sync), 4)
        result["step_alone_ms"] = median_ms([time_step(step, device) for _ in range(args.steps)])
        for pageable in (True, False):
            name = "pageable" if pageable else "pinned"
            mode = measure_mode(scratch, state, args, pageable)
            uri = Path(scratch, f"{name}-steps").as_uri()
            during = steps_during_writes(uri, state, step, args.repeat, pageable)
            mode["step_during_write_ms"] = median_ms(during)
            mode["steps_during_write"] = len(during)
            result[name] = mode
        result.update(writer_host_holds(Path(scratch, "holds").as_uri(), state))
    return with_ratios(result)


def with_ratios(result: dict[str, Any]) -> dict[str, Any]:
    sync_ms = result["sync_save_s"] * 1000
    for name in ("pageable", "pinned"):
        mode = result[name]
        mode["async_stall_ratio"] = round(mode["async_stall_ms"] / sync_ms, 4)
        mode["api_stall_ratio"] = round(mode["api_stall_ms"] / sync_ms, 4)
        mode["step_slowdown"] = round(mode["step_during_write_ms"] / result["step_alone_ms"], 3)
        mode["stall_target_met"] = max(mode["async_stall_ratio"], mode["api_stall_ratio"]) <= (
            STALL_TARGET
        )
        mode["slowdown_target_met"] = mode["step_slowdown"] <= SLOWDOWN_TARGET
    return result


def report(result: dict[str, Any]) -> None:
    print(
        f"{result['state_mb']} MB bf16 state in {result['tensors']} tensors on {result['device']}"
    )
    print(f"  synchronous save           {result['sync_save_s']:.3f} s")
    print(f"  step alone (matmul loop)   {result['step_alone_ms']:.3f} ms")
    for name in ("pageable", "pinned"):
        mode = result[name]
        print(f"  {name} staging:")
        print(
            f"    AsyncCheckpointer stall  {mode['async_stall_ms']:.1f} ms "
            f"({mode['async_stall_ratio']:.2%} of sync; first save "
            f"{mode['first_async_stall_ms']:.1f} ms)"
        )
        print(
            f"    checkpoints().save stall {mode['api_stall_ms']:.1f} ms "
            f"({mode['api_stall_ratio']:.2%}; target <= {STALL_TARGET:.0%}: "
            f"{'met' if mode['stall_target_met'] else 'MISSED'})"
        )
        print(
            f"    step during the write    {mode['step_during_write_ms']:.3f} ms "
            f"({mode['step_slowdown']:.3f}x over {mode['steps_during_write']} steps; "
            f"target <= {SLOWDOWN_TARGET}x: {'met' if mode['slowdown_target_met'] else 'MISSED'})"
        )
    print(
        f"  the write holds the GIL     longest {result['writer_longest_hold_ms']:.1f} ms, "
        f"{result['writer_held_over_5ms_total_ms']:.0f} ms in holds over 5 ms (one write)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--width", type=int, default=4096, help="of the step's matmuls")
    parser.add_argument("--layers", type=int, default=8, help="matmuls in one step")
    parser.add_argument("--steps", type=int, default=50, help="steps timed without a write")
    parser.add_argument("--scratch", default=None, help="where checkpoints are written")
    parser.add_argument("--json", action="store_true", help="the figures as JSON too")
    parser.add_argument("--cpu-smoke", action="store_true", help="a small CPU run, no figures")
    args = parser.parse_args(argv)
    print("command:", " ".join([sys.executable, *sys.argv]), flush=True)
    if args.cpu_smoke:
        args.size_mb, args.repeat, args.width, args.layers, args.steps = 16, 2, 256, 2, 5
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        print("gpu_checkpoint_staging: needs a CUDA GPU (none here); --cpu-smoke checks the script")
        return 0
    result = measure(args, device)
    result["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result["torch"] = torch.__version__
    result["cpu_smoke"] = args.cpu_smoke
    report(result)
    if args.json:
        print(json.dumps(result, indent=2))
    if args.cpu_smoke:
        print("CPU smoke run: the script works; these are not GPU figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
