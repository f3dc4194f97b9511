"""Gang training for the digits example: a small MLP under DDP, using tideflow.runtime.

    python -m tideflow.examples.digits_train --train URI --validation URI [--lr 0.05] ...

Run by every worker of the gang. It resumes from the newest committed
checkpoint when there is one, checkpoints asynchronously, stops cleanly on
SIGTERM (exit 75, resumable) and when the training-health guard trips
(exit 76), and logs metrics to MLflow from rank 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tideflow.checkpoint import CheckpointManager
from tideflow.examples.digits_model import DigitsMLP, accuracy, evaluate, load_split, log_model
from tideflow.runtime import (
    EXIT_PREEMPTED,
    EXIT_UNHEALTHY,
    AsyncCheckpointer,
    DistInfo,
    EnvConfig,
    HealthGuard,
    MetricsLogger,
    MixedPrecision,
    PreemptionWatcher,
    ResumableDistributedSampler,
    TrainingUnhealthy,
    all_agree,
    cleanup,
    init_distributed,
    rng_state,
    seed_everything,
    set_rng_state,
)

# The pipeline names its evaluation and promotion entry points in this module.
__all__ = ["evaluate", "log_model", "main", "parse_args", "train"]

Checkpointer = AsyncCheckpointer | None  # None: no TIDEFLOW_CHECKPOINT_URI, nothing saved


def mean_across_ranks(value: torch.Tensor, info: DistInfo) -> float:
    if info.backend is not None:
        value = value.detach().clone()
        dist.all_reduce(value)
        value /= info.world_size
    return float(value.item())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--train", required=True)
    parser.add_argument("--validation", required=True)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=20,
        help="steps (TIDEFLOW_CHECKPOINT_EVERY_STEPS wins when set)",
    )
    parser.add_argument(
        "--patience",
        type=int,
        default=None,
        help="stop after this many epochs without a better accuracy",
    )
    parser.add_argument(
        "--step-delay",
        type=float,
        default=0.0,
        help="seconds to sleep per step (tests use it to stretch a run)",
    )
    return parser.parse_args(argv)


@dataclass
class TrainingState:
    """What a checkpoint restores: the model, its optimiser, the loss scaler, the
    sampler's place in the data, and how far the run has come."""

    model: DigitsMLP
    optimizer: torch.optim.Optimizer
    precision: MixedPrecision
    sampler: ResumableDistributedSampler
    step: int = 0
    best_accuracy: float = 0.0
    last_saved: int = 0  # the step of this worker's newest checkpoint save

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.precision.state_dict(),
            "sampler": self.sampler.state_dict(),
            "step": self.step,
            "best_accuracy": self.best_accuracy,
        }

    def load_state_dict(self, shared: dict[str, Any], *, elastic: bool) -> None:
        self.model.load_state_dict(shared["model"])
        self.optimizer.load_state_dict(shared["optimizer"])
        self.precision.load_state_dict(shared["scaler"])
        self.sampler.load_state_dict(shared["sampler"], elastic=elastic)
        self.best_accuracy = float(shared["best_accuracy"])


def build_model(
    args: argparse.Namespace, info: DistInfo
) -> tuple[DigitsMLP, nn.Module, torch.optim.Optimizer]:
    """The model, the module the forward pass runs (DDP when distributed), the optimiser."""
    model = DigitsMLP(args.hidden).to(info.device)
    wrapped: nn.Module = DistributedDataParallel(model) if info.backend is not None else model
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    return model, wrapped, optimizer


def print_setup(info: DistInfo, precision: MixedPrecision) -> None:
    dtype = str(precision.dtype).removeprefix("torch.") if precision.enabled else "fp32"
    print(
        f"rank {info.rank}: device {info.device}, precision {dtype}, "
        f"process group {info.backend or 'none'} (world {info.world_size})",
        flush=True,
    )


def log_hyperparameters(metrics: MetricsLogger, args: argparse.Namespace, info: DistInfo) -> None:
    metrics.log_params(
        {
            "lr": args.lr,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "hidden": args.hidden,
            "seed": args.seed,
            "workers": info.world_size,
        }
    )


def open_checkpointer(config: EnvConfig, info: DistInfo, metrics: MetricsLogger) -> Checkpointer:
    """Asynchronous checkpoints to ``TIDEFLOW_CHECKPOINT_URI``; None when it is unset."""
    if not config.checkpoint_uri:
        return None
    manager = CheckpointManager(
        config.checkpoint_uri, keep_last=config.keep_last, keep_best=config.keep_best
    )
    return AsyncCheckpointer(manager, info, on_commit=metrics.log_checkpoint)


def resume(
    checkpointer: Checkpointer, state: TrainingState, config: EnvConfig, info: DistInfo
) -> bool:
    """Load the newest committed checkpoint into ``state``; False when there is none."""
    resumed = checkpointer.load_latest(elastic=config.elastic) if checkpointer else None
    if resumed is None:
        return False
    state.step, shared, mine = resumed
    state.load_state_dict(shared, elastic=config.elastic)
    if "rng" in mine:
        set_rng_state(mine["rng"])
    resized = int(shared["sampler"]["world_size"])
    print(
        f"resumed from step {state.step} (restart {config.restart_count})"
        + (f" on {info.world_size} worker(s), was {resized}" if resized != info.world_size else ""),
        flush=True,
    )
    return True


def save_checkpoint(
    checkpointer: Checkpointer,
    state: TrainingState,
    metrics_now: dict[str, float],
    block: bool = False,
) -> None:
    if checkpointer is not None:
        checkpointer.save(
            state.step,
            state.state_dict(),
            rank_state={"rng": rng_state()},
            metrics=metrics_now,
            block=block,
        )
        state.last_saved = state.step


def train_one_epoch(  # noqa: PLR0917 (the loop's parts, passed as a training script does)
    state: TrainingState,
    wrapped: nn.Module,
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    args: argparse.Namespace,
    info: DistInfo,
    metrics: MetricsLogger,
    guard: HealthGuard,
    watcher: PreemptionWatcher,
    checkpointer: Checkpointer,
    every: int,
    latest_eval: dict[str, float],
) -> bool:
    """One pass over this worker's share of the data, checkpointing every ``every``
    steps. True when the gang agreed to stop (preempted), after a blocking save."""
    precision, optimizer = state.precision, state.optimizer
    for batch in state.sampler.batches():
        with precision.autocast():
            loss = F.cross_entropy(
                wrapped(x_train[batch].to(info.device)), y_train[batch].to(info.device)
            )
        optimizer.zero_grad(set_to_none=True)
        precision.backward(loss)
        precision.step(optimizer)
        state.step += 1
        if args.step_delay:
            time.sleep(args.step_delay)
        loss_value = mean_across_ranks(loss, info)  # same value on every rank
        print(f"step {state.step} loss {loss_value:.4f} at {time.time():.3f}", flush=True)
        metrics.log_metrics({"loss": loss_value}, state.step)
        guard.check_loss(state.step, loss_value)
        if all_agree(watcher.requested, info):
            save_checkpoint(checkpointer, state, {"loss": loss_value}, block=True)
            return True
        if state.step % every == 0:
            save_checkpoint(checkpointer, state, {"loss": loss_value, **latest_eval})
    return False


def validate(
    state: TrainingState,
    validation: tuple[torch.Tensor, torch.Tensor],
    info: DistInfo,
    metrics: MetricsLogger,
    guard: HealthGuard,
) -> dict[str, float]:
    """The end-of-epoch evaluation; what the next checkpoints record (keep_best uses it)."""
    x_val, y_val = validation
    acc = accuracy(state.model, x_val.to(info.device), y_val.to(info.device))
    state.best_accuracy = max(state.best_accuracy, acc)
    epoch = state.sampler.epoch  # epochs completed
    print(f"epoch {epoch} step {state.step} val_accuracy {acc:.4f}", flush=True)
    metrics.log_metrics({"val_accuracy": acc, "epoch": float(epoch)}, state.step)
    guard.check_eval(state.step, acc)
    return {"val_accuracy": acc}


def stop_preempted(
    checkpointer: Checkpointer, watcher: PreemptionWatcher, step: int, metrics: MetricsLogger
) -> int:
    manifest = checkpointer.finalize() if checkpointer else None
    print(
        f"preempted ({watcher.signal_name or 'peer'}) at step {step}; "
        f"checkpoint {manifest.uri if manifest else 'none'}",
        flush=True,
    )
    metrics.close()
    return EXIT_PREEMPTED


def stop_unhealthy(
    exc: TrainingUnhealthy, checkpointer: Checkpointer, metrics: MetricsLogger
) -> int:
    good = checkpointer.mark_last_good() if checkpointer else None
    print(
        f"tideflow: training-health guard stopped the run: {exc}; last good checkpoint: "
        f"step {good}",
        flush=True,
    )
    metrics.set_tags({"tideflow.health": str(exc), "tideflow.last_good_step": str(good)})
    metrics.close(succeeded=False)
    return EXIT_UNHEALTHY


def finish(
    state: TrainingState,
    checkpointer: Checkpointer,
    metrics: MetricsLogger,
    info: DistInfo,
    validation: tuple[torch.Tensor, torch.Tensor],
    *,
    fresh_start: bool,
) -> int:
    """The final evaluation and checkpoint (unless the newest one is of this step)."""
    x_val, y_val = validation
    final_accuracy = accuracy(state.model, x_val.to(info.device), y_val.to(info.device))
    if state.last_saved != state.step or (fresh_start and state.step == 0):
        save_checkpoint(checkpointer, state, {"val_accuracy": final_accuracy}, block=True)
    manifest = checkpointer.finalize() if checkpointer else None
    metrics.log_metrics({"final_val_accuracy": final_accuracy}, state.step)
    metrics.close(succeeded=True)
    if info.is_main:
        print(
            json.dumps(
                {
                    "final_step": state.step,
                    "val_accuracy": round(final_accuracy, 4),
                    "checkpoint": manifest.uri if manifest else None,
                }
            ),
            flush=True,
        )
    return 0


def train(args: argparse.Namespace) -> int:
    config = EnvConfig.from_env()
    info = init_distributed()
    watcher = PreemptionWatcher().install()
    seed_everything(args.seed)
    x_train, y_train = load_split(args.train)
    x_val, y_val = load_split(args.validation)
    model, wrapped, optimizer = build_model(args, info)
    sampler = ResumableDistributedSampler(
        len(x_train),
        batch_size=args.batch_size,
        world_size=info.world_size,
        rank=info.rank,
        seed=args.seed,
    )
    precision = MixedPrecision(info.device)
    print_setup(info, precision)
    guard = HealthGuard(patience_evals=args.patience, mode="max")
    metrics = MetricsLogger(is_main=info.is_main)
    checkpointer = open_checkpointer(config, info, metrics)
    every = config.checkpoint_every_steps or args.checkpoint_every
    state = TrainingState(model, optimizer, precision, sampler)
    resumed = resume(checkpointer, state, config, info)
    if not resumed and info.is_main:
        log_hyperparameters(metrics, args, info)
    state.last_saved = state.step
    latest_eval: dict[str, float] = {}  # recorded with each checkpoint (keep_best uses it)
    try:
        # By epochs, not steps: an elastic gang resumed on other ranks counts steps
        # of another size.
        while sampler.epoch < args.epochs:
            preempted = train_one_epoch(
                state,
                wrapped,
                x_train,
                y_train,
                args,
                info,
                metrics,
                guard,
                watcher,
                checkpointer,
                every,
                latest_eval,
            )
            if preempted:
                return stop_preempted(checkpointer, watcher, state.step, metrics)
            latest_eval = validate(state, (x_val, y_val), info, metrics, guard)
    except TrainingUnhealthy as exc:
        return stop_unhealthy(exc, checkpointer, metrics)
    return finish(state, checkpointer, metrics, info, (x_val, y_val), fresh_start=not resumed)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return train(args)
    finally:
        cleanup()


if __name__ == "__main__":
    sys.exit(main())
