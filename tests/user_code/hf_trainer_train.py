"""A team's HF Trainer script, run under torchrun: a tiny GPT-2 on synthetic tokens.

Written as people write Trainer scripts; the tideflow lines are the import,
``TideflowCallback()`` in ``callbacks`` and ``resume_from_checkpoint=
tideflow_cb.restore()``. Nothing is downloaded: the model is built from a config.
"""

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)

from tideflow.integrations.hf import TideflowCallback


class RandomTokens(Dataset):
    """Sequences with a learnable rule: each token is the previous one plus a fixed step."""

    def __init__(self, count: int, length: int, vocab: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, vocab, (count, 1), generator=generator)
        steps = torch.randint(1, 4, (count, 1), generator=generator)
        self.tokens = (starts + steps * torch.arange(length)) % vocab

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


class SlowSteps(TrainerCallback):
    """Stand-in for a big model: each optimizer step takes a while."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(self.seconds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    args = parser.parse_args()

    set_seed(args.seed)
    config = GPT2Config(
        vocab_size=64,
        n_positions=16,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    data = RandomTokens(count=256, length=16, vocab=64, seed=args.seed)

    training_args = TrainingArguments(
        output_dir=args.output_dir,
        use_cpu=True,
        ddp_backend="gloo",
        ddp_find_unused_parameters=False,
        per_device_train_batch_size=8,
        num_train_epochs=args.epochs,
        learning_rate=args.lr,
        lr_scheduler_type="linear",
        warmup_steps=4,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        disable_tqdm=True,
    )
    tideflow_cb = TideflowCallback()
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=data,
        callbacks=[tideflow_cb, SlowSteps(args.step_sleep)],
    )
    trainer.train(resume_from_checkpoint=tideflow_cb.restore())

    rank = int(os.environ.get("RANK", "0"))
    weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "rank": rank,
        "global_step": trainer.state.global_step,
        "weights_sha256": hashlib.sha256(weights).hexdigest(),
    }
    (out / f"rank-{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
