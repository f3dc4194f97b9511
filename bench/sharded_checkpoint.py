"""Training stall of a DCP async save versus a synchronous DCP save of the same sharded state.

    .venv/bin/python bench/sharded_checkpoint.py [--size-mb 256] [--repeat 3] [--nproc 2]

Starts ``--nproc`` gloo processes on the CPU (torchrun's variables, set here),
each holding its FSDP2 shard of a model of ``--size-mb`` MB of float32
parameters, plus AdamW's two moments (so the saved state is about three times
that, split over the ranks). In one run, alternately: ``save_sharded`` (plan,
serialise, hash, write every rank's shard, commit the manifest, before
training goes on) and ``async_save_sharded`` (training waits only for DCP's
staging copy; the rest runs on a background thread), each into a ``file://``
store. The stall is the time until control returns to the training loop, the
slower rank's. The first async save also creates the dedicated gloo group its
background collectives use, so the figure reported is the median of the
saves after it; the first is printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.fsdp import fully_shard

from tideflow.checkpoint import CheckpointManager
from tideflow.runtime.sharded import async_save_sharded, save_sharded

WIDTH = 2048  # each layer is WIDTH x WIDTH float32: 16 MB


def build(size_mb: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    layers = max(1, size_mb * 1024 * 1024 // (WIDTH * WIDTH * 4))
    model = nn.Sequential(*(nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8, WIDTH)
    model(x).square().mean().backward()  # one step, so the moments exist
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


def slowest(seconds: float) -> float:
    """The largest of every rank's figure: the training loop goes on when all ranks do."""
    value = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


def worker(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, optimizer = build(args.size_mb)
    root = Path(args.root)
    sync_manager = CheckpointManager((root / "sync").as_uri(), keep_last=1)
    async_manager = CheckpointManager((root / "async").as_uri(), keep_last=1)
    sync_times, stalls, async_totals = [], [], []
    for step in range(args.repeat + 1):
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state}
        if step < args.repeat:
            dist.barrier()
            started = time.perf_counter()
            save_sharded(sync_manager, step, state)
            sync_times.append(slowest(time.perf_counter() - started))
            if rank == 0:
                sync_manager.apply_retention()
        dist.barrier()
        pending = async_save_sharded(async_manager, step, state)
        # Training would go on here; the figures below wait for the commit.
        pending.result()
        stalls.append(slowest(pending.stall_seconds))
        async_totals.append(slowest(pending.seconds or 0.0))
        if rank == 0:
            async_manager.apply_retention()
    if rank == 0:
        manifest = sync_manager.latest(verify=False)
        state_bytes = sum(r.size for r in manifest.shards) if manifest else 0
        result = {
            "nproc": dist.get_world_size(),
            "model_mb": args.size_mb,
            "saved_mb": round(state_bytes / 2**20, 1),
            "sync_save_s": statistics.median(sync_times),
            "async_stall_s": statistics.median(stalls[1:]),
            "first_async_stall_s": stalls[0],
            "async_commit_s": statistics.median(async_totals[1:]),
            "sync_saves_s": sync_times,
            "async_stalls_s": stalls,
            "async_commits_s": async_totals,
        }
        result["ratio"] = result["async_stall_s"] / result["sync_save_s"]
        Path(args.result).write_text(json.dumps(result))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def launch(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tideflow-bench-dcp-") as scratch:
        result = Path(scratch, "result.json")
        port = str(free_port())
        command = [sys.executable, __file__, "--worker", "--root", scratch, "--result", str(result)]
        command += ["--size-mb", str(args.size_mb), "--repeat", str(args.repeat)]
        procs = []
        for rank in range(args.nproc):
            env = {
                **os.environ,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(args.nproc),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
                "OMP_NUM_THREADS": "1",
            }
            procs.append(subprocess.Popen(command, env=env))
        codes = [proc.wait() for proc in procs]
        if any(codes):
            raise SystemExit(f"a rank failed: exit codes {codes}")
        loaded: dict[str, Any] = json.loads(result.read_text())
        return loaded


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=256, help="model parameters, MB")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    result = launch(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"{result['nproc']} gloo ranks (CPU), FSDP2 model of {result['model_mb']} MB "
        f"+ AdamW: {result['saved_mb']} MB saved per checkpoint; median of {args.repeat}"
    )
    print(f"  synchronous DCP save      {result['sync_save_s']:.3f} s")
    print(
        f"  async DCP save, stall     {result['async_stall_s'] * 1000:.1f} ms "
        f"(first save, making its gloo group: {result['first_async_stall_s'] * 1000:.1f} ms)"
    )
    print(f"  async DCP save, commit    {result['async_commit_s']:.3f} s after the call")
    print(f"  stall / sync              {result['ratio']:.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
