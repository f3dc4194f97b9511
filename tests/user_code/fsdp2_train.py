"""An FSDP2 training script, written the way teams write one, saving through tideflow's DCP layer.

Run it under torchrun (or with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set):

    torchrun --nproc-per-node 2 fsdp2_train.py --store file:///tmp/ckpt --steps 4 --out out/

Training: ``--steps`` AdamW steps on a fixed synthetic dataset, each rank
taking its share of every batch, then a checkpoint of model and optimizer at
step ``--steps`` (``save_sharded``; with ``--async-store`` also
``async_save_sharded`` of the same state into a second store, while training
goes on). ``--resume`` instead loads the newest checkpoint (or ``--step``) at
whatever world size this run has; ``--no-verify`` skips the up-front scan of
every shard (each rank still checks the shards it reads).

Either way it then reports, in ``rank-R.json`` under ``--out``: the loss of
the full model on a fixed evaluation batch, and that loss after one more
full-batch AdamW step (every rank on the whole batch, so the step is the same
at any world size). Rank 0 also writes the full (unsharded) model and
optimizer state it saved or loaded to ``state.pt``.
"""

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard

from tideflow.checkpoint import CheckpointManager
from tideflow.runtime.sharded import async_save_sharded, load_sharded, save_sharded

BATCH = 32
HIDDEN = 26  # splits unevenly over 3 ranks; the 4-row output layer leaves one rank empty


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, 4)
    )


def make_data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(8 * BATCH, 16, generator=generator)
    w = torch.randn(16, 4, generator=generator)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(8 * BATCH, 4, generator=generator)
    return x, y


def eval_batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(99)
    x = torch.randn(64, 16, generator=generator)
    return x, torch.sin(x[:, :4])


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> float:
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def eval_loss(model: nn.Module) -> float:
    x, y = eval_batch()
    with torch.no_grad():
        return nn.functional.mse_loss(model(x), y).item()


def dump_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, path: Path) -> None:
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    if dist.get_rank() == 0:
        torch.save({"model": model_state, "optim": optim_state}, path)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--async-store")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--step", type=int)
    parser.add_argument("--no-verify", action="store_true", help="skip the up-front shard scan")
    parser.add_argument("--out", required=True)
    return parser.parse_args()


def resume(
    model: nn.Module, optimizer: torch.optim.Optimizer, args: argparse.Namespace
) -> dict[str, object]:
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    checkpoints = CheckpointManager(args.store)
    manifest = load_sharded(checkpoints, state, step=args.step, verify=not args.no_verify)
    if manifest is None:
        raise SystemExit("no checkpoint to resume from")
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    return {"resumed_from": manifest.step}


def train_and_save(
    model: nn.Module, optimizer: torch.optim.Optimizer, args: argparse.Namespace
) -> dict[str, object]:
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = make_data()
    for step in range(args.steps):
        batch = slice(step % 8 * BATCH, (step % 8 + 1) * BATCH)
        train_step(model, optimizer, x[batch][rank::world], y[batch][rank::world])
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    started = time.perf_counter()
    manifest = save_sharded(
        CheckpointManager(args.store), args.steps, state, metrics={"step": args.steps}
    )
    return {
        "sync_seconds": time.perf_counter() - started,
        "manifest": None if manifest is None else manifest.checksum,
    }


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    model = build_model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    report: dict[str, object] = {"rank": rank, "world_size": world}
    report["initial_loss"] = eval_loss(model)
    report |= (
        resume(model, optimizer, args) if args.resume else train_and_save(model, optimizer, args)
    )
    dump_full_state(model, optimizer, out / "state.pt")
    report["loss"] = eval_loss(model)

    pending = None
    if args.async_store:
        model_state, optim_state = get_state_dict(model, optimizer)
        pending = async_save_sharded(
            CheckpointManager(args.async_store),
            args.steps,
            {"model": model_state, "optim": optim_state},
            metrics={"step": args.steps},
        )
        report["async_stall_seconds"] = pending.stall_seconds
    # The next step changes parameters and optimizer state in place while an
    # async save may still be writing them.
    train_step(model, optimizer, *eval_batch())
    report["loss_after_step"] = eval_loss(model)
    if pending is not None:
        committed = pending.result()
        report["async_seconds"] = pending.seconds
        report["async_manifest"] = None if committed is None else committed.checksum

    (out / f"rank-{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
