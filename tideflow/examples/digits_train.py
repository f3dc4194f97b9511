"""Gang training for the digits example: a small MLP under DDP, using tideflow.runtime.

    python -m tideflow.examples.digits_train --train URI --validation URI [--lr 0.05] ...

Run by every worker of the gang. It resumes from the newest committed
checkpoint when there is one, checkpoints asynchronously, stops cleanly on
SIGTERM (exit 75, resumable) and when the training-health guard trips
(exit 76), and logs metrics to MLflow from rank 0.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tideflow import settings_registry as registry
from tideflow.checkpoint import CheckpointManager
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
from tideflow.storage import open_store


def load_split(uri: str) -> tuple[torch.Tensor, torch.Tensor]:
    base, _, name = uri.rpartition("/")
    data = open_store(base).get_bytes(name)
    with np.load(io.BytesIO(data)) as arrays:
        return torch.from_numpy(arrays["x"]).float(), torch.from_numpy(arrays["y"]).long()


class DigitsMLP(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)  # type: ignore[no-any-return]


def mean_across_ranks(value: torch.Tensor, info: DistInfo) -> float:
    if info.backend is not None:
        value = value.detach().clone()
        dist.all_reduce(value)
        value /= info.world_size
    return float(value.item())


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        correct = int((model(x).argmax(dim=1) == y).sum().item())
    model.train()
    return correct / len(y)


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


def train(args: argparse.Namespace) -> int:  # noqa: PLR0915 - one readable training loop
    config = EnvConfig.from_env()
    info = init_distributed()
    watcher = PreemptionWatcher().install()
    seed_everything(args.seed)
    x_train, y_train = load_split(args.train)
    x_val, y_val = load_split(args.validation)
    model = DigitsMLP(args.hidden).to(info.device)
    wrapped: nn.Module = DistributedDataParallel(model) if info.backend is not None else model
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sampler = ResumableDistributedSampler(
        len(x_train),
        batch_size=args.batch_size,
        world_size=info.world_size,
        rank=info.rank,
        seed=args.seed,
    )
    precision = MixedPrecision(info.device)
    dtype = str(precision.dtype).removeprefix("torch.") if precision.enabled else "fp32"
    print(
        f"rank {info.rank}: device {info.device}, precision {dtype}, "
        f"process group {info.backend or 'none'} (world {info.world_size})",
        flush=True,
    )
    guard = HealthGuard(patience_evals=args.patience, mode="max")
    metrics = MetricsLogger(is_main=info.is_main)
    checkpointer = None
    if config.checkpoint_uri:
        manager = CheckpointManager(
            config.checkpoint_uri, keep_last=config.keep_last, keep_best=config.keep_best
        )
        checkpointer = AsyncCheckpointer(manager, info, on_commit=metrics.log_checkpoint)
    every = config.checkpoint_every_steps or args.checkpoint_every
    step = 0
    best_accuracy = 0.0
    resumed = checkpointer.load_latest(elastic=config.elastic) if checkpointer else None
    if resumed is not None:
        step, shared, mine = resumed
        model.load_state_dict(shared["model"])
        optimizer.load_state_dict(shared["optimizer"])
        precision.load_state_dict(shared["scaler"])
        sampler.load_state_dict(shared["sampler"], elastic=config.elastic)
        best_accuracy = float(shared["best_accuracy"])
        if "rng" in mine:
            set_rng_state(mine["rng"])
        resized = int(shared["sampler"]["world_size"])
        print(
            f"resumed from step {step} (restart {config.restart_count})"
            + (
                f" on {info.world_size} worker(s), was {resized}"
                if resized != info.world_size
                else ""
            ),
            flush=True,
        )
    elif info.is_main:
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
    last_saved = step
    latest_eval: dict[str, float] = {}  # recorded with each checkpoint (keep_best uses it)

    def state() -> dict[str, Any]:
        return {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scaler": precision.state_dict(),
            "sampler": sampler.state_dict(),
            "step": step,
            "best_accuracy": best_accuracy,
        }

    def save(metrics_now: dict[str, float], block: bool = False) -> None:
        nonlocal last_saved
        if checkpointer is not None:
            checkpointer.save(
                step, state(), rank_state={"rng": rng_state()}, metrics=metrics_now, block=block
            )
            last_saved = step

    try:
        # By epochs, not steps: an elastic gang resumed on other ranks counts steps
        # of another size.
        while sampler.epoch < args.epochs:
            for batch in sampler.batches():
                with precision.autocast():
                    loss = F.cross_entropy(
                        wrapped(x_train[batch].to(info.device)), y_train[batch].to(info.device)
                    )
                optimizer.zero_grad(set_to_none=True)
                precision.backward(loss)
                precision.step(optimizer)
                step += 1
                if args.step_delay:
                    time.sleep(args.step_delay)
                loss_value = mean_across_ranks(loss, info)  # same value on every rank
                print(f"step {step} loss {loss_value:.4f} at {time.time():.3f}", flush=True)
                metrics.log_metrics({"loss": loss_value}, step)
                guard.check_loss(step, loss_value)
                if all_agree(watcher.requested, info):
                    save({"loss": loss_value}, block=True)
                    manifest = checkpointer.finalize() if checkpointer else None
                    print(
                        f"preempted ({watcher.signal_name or 'peer'}) at step {step}; "
                        f"checkpoint {manifest.uri if manifest else 'none'}",
                        flush=True,
                    )
                    metrics.close()
                    return EXIT_PREEMPTED
                if step % every == 0:
                    save({"loss": loss_value, **latest_eval})
            acc = accuracy(model, x_val.to(info.device), y_val.to(info.device))
            best_accuracy = max(best_accuracy, acc)
            latest_eval = {"val_accuracy": acc}
            epoch = sampler.epoch  # epochs completed
            print(f"epoch {epoch} step {step} val_accuracy {acc:.4f}", flush=True)
            metrics.log_metrics({"val_accuracy": acc, "epoch": float(epoch)}, step)
            guard.check_eval(step, acc)
    except TrainingUnhealthy as exc:
        good = checkpointer.mark_last_good() if checkpointer else None
        print(
            f"tideflow: training-health guard stopped the run: {exc}; last good checkpoint: "
            f"step {good}",
            flush=True,
        )
        metrics.set_tags({"tideflow.health": str(exc), "tideflow.last_good_step": str(good)})
        metrics.close(succeeded=False)
        return EXIT_UNHEALTHY
    final_accuracy = accuracy(model, x_val.to(info.device), y_val.to(info.device))
    if last_saved != step or (resumed is None and step == 0):
        save({"val_accuracy": final_accuracy}, block=True)
    manifest = checkpointer.finalize() if checkpointer else None
    metrics.log_metrics({"final_val_accuracy": final_accuracy}, step)
    metrics.close(succeeded=True)
    if info.is_main:
        print(
            json.dumps(
                {
                    "final_step": step,
                    "val_accuracy": round(final_accuracy, 4),
                    "checkpoint": manifest.uri if manifest else None,
                }
            ),
            flush=True,
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return train(args)
    finally:
        cleanup()


if __name__ == "__main__":
    sys.exit(main())


def evaluate(
    ctx: Any, validation: str, checkpoint_store: str, checkpoint_step: int, checkpoint: str = ""
) -> dict[str, float]:
    """Evaluation entry point: the checkpoint's accuracy and loss on the validation split.

    Loads exactly the checkpoint the training step reported, verifying every
    shard against the manifest's SHA-256 before use, on the device the
    evaluation step was given (``TIDEFLOW_DEVICE_CLASS``).
    """

    from tideflow.runtime.distributed import device_for_class

    manager = CheckpointManager(checkpoint_store)
    manifest = next((m for m in manager.committed() if m.step == int(checkpoint_step)), None)
    if manifest is None:
        raise RuntimeError(
            f"no committed checkpoint at step {checkpoint_step} in {checkpoint_store}"
        )
    problems = manager.verify(manifest)
    if problems:
        raise RuntimeError(f"checkpoint step {manifest.step} failed verification: {problems}")
    state = torch.load(
        io.BytesIO(manager.read_shard(manifest, "model.pt")), map_location="cpu", weights_only=True
    )
    weights = state["model"]
    model = DigitsMLP(int(weights["layers.0.weight"].shape[0]))
    model.load_state_dict(weights)
    device_class = registry.text("TIDEFLOW_DEVICE_CLASS")
    device, emulated = device_for_class(device_class)
    if emulated or registry.flag("TIDEFLOW_EMULATED"):
        device = torch.device("cpu")
        print(f"evaluating emulated on the CPU (asked for {device_class})", flush=True)
    model.to(device).eval()
    x_val, y_val = load_split(validation)
    with torch.no_grad():
        logits = model(x_val.to(device))
        loss = float(F.cross_entropy(logits, y_val.to(device)).item())
        acc = float((logits.argmax(dim=1) == y_val.to(device)).float().mean().item())
    print(
        f"checkpoint step {manifest.step} ({manifest.checksum[:12]}): accuracy {acc:.4f}, "
        f"loss {loss:.4f} on {device}",
        flush=True,
    )
    return {"accuracy": acc, "loss": loss}


def log_model(
    ctx: Any,
    *,
    checkpoint_store: str,
    checkpoint_step: int,
    validation: str,
    run_id: str,
    checkpoint: str = "",
) -> dict[str, str]:
    """Promotion builder: log the checkpoint as an MLflow pytorch model into ``run_id``.

    The input example (five validation images) gives the model its signature,
    so ``mlflow.pyfunc.load_model("models:/NAME@champion").predict(x)`` works.
    """
    import mlflow
    import mlflow.pytorch

    manager = CheckpointManager(checkpoint_store)
    manifest = next((m for m in manager.committed() if m.step == int(checkpoint_step)), None)
    if manifest is None:
        raise RuntimeError(f"no committed checkpoint at step {checkpoint_step}")
    state = torch.load(
        io.BytesIO(manager.read_shard(manifest, "model.pt")), map_location="cpu", weights_only=True
    )
    weights = state["model"]
    model = DigitsMLP(int(weights["layers.0.weight"].shape[0]))
    model.load_state_dict(weights)
    model.eval()
    x_val, _ = load_split(validation)
    with mlflow.start_run(run_id=run_id):
        info = mlflow.pytorch.log_model(model, name="model", input_example=x_val[:5].numpy())
    print(f"logged checkpoint step {manifest.step} as {info.model_uri}", flush=True)
    return {"model_uri": str(info.model_uri)}
