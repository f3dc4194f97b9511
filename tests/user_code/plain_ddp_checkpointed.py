"""plain_ddp.py with tideflow's checkpoints: the lines a team adds, nothing else.

Compare the two files (tests/checkpoints/test_checkpoints_api.py counts the difference):
``import tideflow``, ``tideflow.ResumableSampler`` for ``DistributedSampler``,
``tideflow.checkpoints(...)``, ``restore()``, the epoch loop starting at the
sampler's epoch, a step counter, ``save`` after each optimizer step and
``finish`` at the end.
"""

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

import tideflow

TORCHRUN_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
)


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def make_data(seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(512, 8, generator=generator)
    y = (x[:, 0] + x[:, 1] > 0).long()
    return TensorDataset(x, y)


def evaluate(model: nn.Module, data: TensorDataset) -> float:
    model.eval()
    with torch.no_grad():
        x, y = data.tensors
        return float((model(x).argmax(dim=1) == y).float().mean())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="stand-in for a big model")
    parser.add_argument("--find-unused-parameters", action="store_true")
    args = parser.parse_args()

    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.manual_seed(args.seed)

    data = make_data(args.seed)
    sampler = tideflow.ResumableSampler(data, num_replicas=world, rank=rank, seed=args.seed)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    model = DistributedDataParallel(
        build_model(), find_unused_parameters=args.find_unused_parameters
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    ckpt = tideflow.checkpoints(model=model, optimizer=optimizer, sampler=sampler)
    step = ckpt.restore()

    loss = torch.tensor(0.0)
    for epoch in range(sampler.epoch, args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            ckpt.save(step, metrics={"loss": loss.item()})
            time.sleep(args.step_sleep)
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)

    ckpt.finish(step)
    accuracy = evaluate(model.module, data) if rank == 0 else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "rank": rank,
        "local_rank": local_rank,
        "world_size": world,
        "loss": loss.item(),
        "accuracy": accuracy,
        # a fingerprint of the trained weights: DDP keeps them equal on every rank
        "weights": sum(float(p.double().sum()) for p in model.module.parameters()),
        "weights_sha256": hashlib.sha256(
            b"".join(p.detach().numpy().tobytes() for p in model.module.parameters())
        ).hexdigest(),
        "environment": {name: os.environ.get(name) for name in TORCHRUN_VARIABLES},
        "threads": torch.get_num_threads(),
    }
    (out / f"rank-{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
