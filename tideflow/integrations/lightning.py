"""tideflow's checkpoint guarantees for PyTorch Lightning 2.x, in three lines.

    from tideflow.integrations.lightning import TideflowCallback

    tideflow_cb = TideflowCallback()
    trainer = L.Trainer(..., callbacks=[tideflow_cb])
    trainer.fit(model, train_loader, ckpt_path=tideflow_cb.restore())

What the script gets for that, on every rank of a gang (torchrun's
environment: Lightning runs as an external-launcher DDP job):

* **Crash-consistent checkpoints in the gang's store.** After an optimizer step
  the policy picks (``every_steps`` / ``every_seconds`` of the step's checkpoint
  policy; every 600 s without either) every rank calls
  ``trainer.save_checkpoint``: rank 0's Lightning checkpoint (model, optimizers,
  schedulers, callbacks and the loops' state) and each rank's RNG state are
  committed to the store as one checkpoint through ``GangCommit``, uploaded in
  the background. The final state is committed when ``fit`` ends.
* **Exact resume.** ``restore()`` downloads the newest committed checkpoint
  (checksums verified) and returns the path for ``fit(ckpt_path=...)``; Lightning
  restores the model, optimizers and loops; this callback also restores each
  rank's RNG streams and, for a checkpoint taken mid-epoch, moves the training
  data past the batches already trained on (Lightning alone would restart the
  epoch's data from its first batch). Exact for a map-style dataset with a
  length: the epoch's order comes from the sampler and its epoch.
* **Checkpoint-before-evict.** SIGTERM is recorded; after the next optimizer
  step every rank agrees, the checkpoint is committed and the process exits 75,
  which every tideflow backend resumes from. (Lightning's own SIGTERM handler
  broadcasts from inside the signal handler; this callback replaces it for the
  training loop.)
* **The training-health guard** on the ``loss`` that ``training_step``
  returns, on each rank: a non-finite or exploding value on any rank stops
  every rank before that step is saved, marks the newest committed checkpoint
  ``last-good`` and exits 76.
* **Metrics on the step's MLflow run**: rank 0's training loss each step and
  what the module logs (``callback_metrics``) at each epoch's end.

Sharded strategies (FSDP, DeepSpeed) write a directory per checkpoint and
are refused with a clear error.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.data import _set_sampler_epoch

from tideflow.checkpoint import Manifest
from tideflow.integrations._gang import GangCheckpoints
from tideflow.runtime.seeding import rng_state, set_rng_state

FRAMEWORK = "lightning"
CHECKPOINT_SHARD = "checkpoint.ckpt"  # rank 0's Lightning checkpoint
RESUME_DIR = ".tideflow-resume"
LOCAL_DIR = ".tideflow-checkpoints"


def rng_shard(rank: int) -> str:
    return f"rng-rank-{rank}.pt"


class TideflowCallback(pl.Callback):
    """Commits Lightning checkpoints to the gang's store; stops on SIGTERM and on divergence.

    ``guard``: the key of ``training_step``'s returned dict (or the returned
    loss tensor) the health guard watches (None: no guard). ``every_steps`` /
    ``every_seconds``: how often to save when the step's checkpoint policy says
    nothing (it wins); 600 s without either.
    """

    def __init__(
        self,
        *,
        guard: str | None = "loss",
        every_steps: int | None = None,
        every_seconds: float | None = None,
    ) -> None:
        self.gang = GangCheckpoints(FRAMEWORK, every_steps=every_steps, every_seconds=every_seconds)
        self.guard_metric = guard
        # Where the epoch's data stood when the checkpoint was taken: saved in
        # the checkpoint (state_dict) and, restored, used to skip those batches.
        self.position: dict[str, int] = {}
        self._resume_position: dict[str, int] = {}
        self._resume_rng: dict[str, Any] | None = None
        self._last_step = -1

    # -- resuming ----------------------------------------------------------------------
    def restore(self, dest: str | os.PathLike[str] | None = None) -> str | None:
        """The local path of the newest committed checkpoint, downloaded; None if there is none.

        Pass it to ``trainer.fit(..., ckpt_path=...)``. Files go under
        ``dest`` (default: the working directory) in ``.tideflow-resume/rank-R``.
        """
        rank = self.gang.rank

        def wanted(manifest: Manifest) -> list[str]:
            written_by = int(manifest.meta.get("world_size", self.gang.world_size))
            return [CHECKPOINT_SHARD] + ([rng_shard(rank)] if rank < written_by else [])

        base = Path(dest or ".") / RESUME_DIR / f"rank-{rank}"
        restored = self.gang.restore_into(base, wanted)
        if restored is None:
            return None
        _, folder = restored
        rng_file = folder / rng_shard(rank)
        if rng_file.exists():  # an elastic gang's new rank has none: it starts its own stream
            self._resume_rng = torch.load(rng_file, map_location="cpu", weights_only=True)
        return str(folder / CHECKPOINT_SHARD)

    def state_dict(self) -> dict[str, Any]:
        return dict(self.position)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._resume_position = {k: int(v) for k, v in state_dict.items()}

    # -- Lightning's hooks --------------------------------------------------------------
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning has just installed its SIGTERM handler, which runs a
        # broadcast inside the signal handler: with every rank signalled at
        # once the ranks' collectives no longer pair up. Put tideflow's back; it
        # only records the signal, and the ranks agree after the next step.
        self.gang.watcher.install()
        if self._resume_position:
            self._skip_trained_batches(trainer)
            self._resume_position = {}
        if self._resume_rng is not None:
            # after the skip, which may draw from the RNG as a dataset loads samples
            set_rng_state(self._resume_rng)
            self._resume_rng = None
        self._last_step = trainer.global_step

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        step = trainer.global_step
        # Saving or stopping between the batches of one accumulated step would
        # lose the accumulated gradients: only after an optimizer step.
        stepped = step != self._last_step
        self._last_step = step
        loss = _value(outputs, self.guard_metric or "loss")
        if loss is not None:
            self.gang.log_metrics({"loss": loss}, step)
        reason = self.gang.check_health(step, loss) if self.guard_metric is not None else ""
        # One small all-reduce per batch, on every rank: stop, sick, time to save.
        stop, sick, time_due = self.gang.agree(
            self.gang.watcher.requested, bool(reason), self.gang.time_due()
        )
        if sick:
            self.gang.stop_unhealthy(step, reason or "another rank's guard tripped")
        if not stepped:
            return
        if stop:
            if self.gang.manager is not None:
                self._save(trainer, step, batch_idx, block=True)
            self.gang.stop_preempted(step)
        if self.gang.manager is not None and self.gang.due(step, time_due=time_due):
            self._save(trainer, step, batch_idx, block=False)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        values = {
            name: float(value)
            for name, value in trainer.callback_metrics.items()
            if isinstance(value, torch.Tensor) and value.numel() == 1
        }
        self.gang.log_metrics(values, trainer.global_step)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        step = trainer.global_step
        if self.gang.manager is not None and self.gang.saved_step != step:
            self._save(trainer, step, None, block=True)  # the final state: the step's output
        self.gang.finish()

    # -- internals ----------------------------------------------------------------------
    def _save(self, trainer: pl.Trainer, step: int, batch_idx: int | None, *, block: bool) -> None:
        """Every rank: Lightning's checkpoint (rank 0 writes it) and its RNG, to the store."""
        rank = self.gang.rank
        folder = Path(trainer.default_root_dir) / LOCAL_DIR / f"rank-{rank}" / f"step-{step}"
        folder.mkdir(parents=True, exist_ok=True)
        epoch = trainer.current_epoch
        self.position = {"epoch": epoch, "batches_done": -1 if batch_idx is None else batch_idx + 1}
        # Collective in Lightning (a barrier): every rank calls it, rank 0 writes.
        trainer.save_checkpoint(folder / CHECKPOINT_SHARD, weights_only=False)
        torch.save(rng_state(), folder / rng_shard(rank))
        files = {rng_shard(rank): folder / rng_shard(rank)}
        if trainer.is_global_zero:
            if not (folder / CHECKPOINT_SHARD).is_file():
                raise NotImplementedError(
                    f"{type(trainer.strategy).__name__} saves a checkpoint as a directory "
                    "(a sharded strategy): tideflow's Lightning callback commits single-file "
                    "checkpoints (DDP or one device)"
                )
            files[CHECKPOINT_SHARD] = folder / CHECKPOINT_SHARD
        self.gang.commit(step, files, block=block, cleanup=folder)

    def _skip_trained_batches(self, trainer: pl.Trainer) -> None:
        """Draw, from the epoch's data, the batches the checkpoint had already trained on.

        Lightning restores the loops at the batch where the checkpoint was taken
        but iterates the epoch's data from its start; a resumable data loader
        would resume itself, a plain one is moved past those batches here, in
        the epoch's order (its sampler set to the epoch first, as Lightning
        does before the first batch).
        """
        loop = trainer.fit_loop
        epoch = trainer.current_epoch  # the epoch the loop resumes in
        done = self._resume_position.get("batches_done", 0)
        if (
            self._resume_position.get("epoch") != epoch
            or not 0 < done < trainer.num_training_batches
        ):
            return  # saved at an epoch's end: the next epoch starts from its beginning
        fetcher = loop._data_fetcher
        combined = loop._combined_loader
        if fetcher is None or fetcher.iterator is None or combined is None:
            raise RuntimeError(
                "Lightning's training data is not set up at on_train_start; this "
                "Lightning version is not supported by tideflow's callback"
            )
        for loader in combined.flattened:
            _set_sampler_epoch(loader, epoch)
        for _ in range(done):
            next(fetcher.iterator)
        self.gang.say(f"skipped the {done} batches of epoch {epoch} trained before the checkpoint")


def _value(outputs: Any, key: str) -> float | None:
    """The scalar ``key`` of what ``training_step`` returned (a dict, or the loss tensor)."""
    value = outputs.get(key) if isinstance(outputs, Mapping) else outputs
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.detach())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None
