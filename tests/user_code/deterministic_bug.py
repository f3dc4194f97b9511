"""A DDP script with a bug that hits rank 1 at the same step on every attempt.

    python deterministic_bug.py --bad-step 12 [--hang] [--then-fail-at 17]

With ``--hang`` the bug is a hang instead of an exception: rank 1 waits forever
at that step, as on a lock it never gets. With ``--then-fail-at N`` the attempts
after the first meet another bug: rank 1 raises at step N.
"""

import argparse
import os
import threading

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import tideflow


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bad-step", type=int, required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--then-fail-at", type=int)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt = tideflow.checkpoints(model=model, optimizer=optimizer)
    step = ckpt.restore()
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    the_first_bug = first_attempt or args.then_fail_at is None
    bad_step = args.bad_step if the_first_bug else args.then_fail_at
    while step < args.steps:
        if rank == 1 and step == bad_step:
            if args.hang and the_first_bug:
                threading.Event().wait()  # a lock that is never released
            raise ValueError(f"bad record in shard {step}")
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        ckpt.save(step, metrics={"loss": loss.item()})
    ckpt.finish(step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
