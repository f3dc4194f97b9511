"""A team's PyTorch Lightning script, run under torchrun: DDP on CPU, synthetic data.

Written as people write Lightning scripts; the tideflow lines are the import,
``TideflowCallback()`` in ``callbacks`` and ``ckpt_path=tideflow_cb.restore()``.
Lightning sees torchrun's environment (TorchElastic) and joins the gang's
process group instead of launching processes itself.
"""

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import lightning as L  # noqa: N812 - the name Lightning's documentation uses
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tideflow.integrations.lightning import TideflowCallback


class Classifier(L.LightningModule):
    def __init__(self, lr: float, step_sleep: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(8, 32),
            nn.ReLU(),
            nn.Dropout(0.2),
            nn.Linear(32, 32),
            nn.ReLU(),
            nn.Linear(32, 2),
        )
        self.loss_fn = nn.CrossEntropyLoss()

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        x, y = batch
        loss = self.loss_fn(self.net(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        time.sleep(self.hparams.step_sleep)  # stand-in for a big model
        return loss

    def on_train_epoch_end(self) -> None:
        if self.trainer.is_global_zero:
            loss = self.trainer.callback_metrics["train_loss"]
            print(f"epoch {self.current_epoch}: train_loss {loss:.4f}", flush=True)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.7)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


def make_data(seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(512, 8, generator=generator)
    y = (x[:, 0] * x[:, 1] + x[:, 2] > 0).long()
    return TensorDataset(x, y)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    args = parser.parse_args()

    L.seed_everything(args.seed)
    model = Classifier(args.lr, args.step_sleep)
    loader = DataLoader(make_data(args.seed), batch_size=16, shuffle=True)

    tideflow_cb = TideflowCallback()
    trainer = L.Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", "1")),
        max_epochs=args.epochs,
        default_root_dir=args.output_dir,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[tideflow_cb],
    )
    trainer.fit(model, loader, ckpt_path=tideflow_cb.restore(args.output_dir))

    rank = trainer.global_rank
    weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "rank": rank,
        "global_step": trainer.global_step,
        "weights_sha256": hashlib.sha256(weights).hexdigest(),
    }
    (out / f"rank-{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
