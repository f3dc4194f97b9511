"""tideflow's checkpoint guarantees for HF ``transformers.Trainer``, in three lines.

    from tideflow.integrations.hf import TideflowCallback

    tideflow_cb = TideflowCallback()
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[tideflow_cb])
    trainer.train(resume_from_checkpoint=tideflow_cb.restore())

What the script gets for that, on every rank of a gang:

* **Crash-consistent checkpoints in the gang's store.** Each ``checkpoint-N``
  folder Trainer saves is committed to the store as step N: every rank
  contributes the files it owns (its ``rng_state_R.pth``; rank 0 everything
  else), and rank 0 commits the manifest once every rank's files are in, so a
  checkpoint missing a rank's part is never resumed from. The upload runs in the
  background from a private copy (Trainer deletes and rewrites its folders).
  With ``every_steps`` in the step's checkpoint policy
  (``TIDEFLOW_CHECKPOINT_EVERY_STEPS``) Trainer saves at that cadence whatever
  its ``save_strategy``; the final step is always committed.
* **Exact resume.** ``restore()`` downloads the newest committed checkpoint
  (checksums verified) into ``<output_dir>/.tideflow-resume/rank-R/`` and
  returns its path, or None when there is none; Trainer restores the model,
  optimizer, scheduler, its loop position and each rank's RNG from it.
* **Checkpoint-before-evict.** SIGTERM is recorded; after the next optimizer
  step every rank agrees, Trainer saves, the checkpoint is committed and the
  process exits 75, which every tideflow backend resumes from.
* **The training-health guard** on the logged ``loss`` (the mean over the
  gang that Trainer logs every ``logging_steps``): a non-finite or exploding
  value stops every rank before that step is saved, marks the newest committed
  checkpoint ``last-good`` and exits 76. Trainer's ``logging_nan_inf_filter``
  (on by default) replaces a NaN step loss in the log by the running mean; the
  explosion that precedes a NaN still trips the guard, and with the filter off
  the NaN itself does.
* **Metrics on the step's MLflow run**: whatever Trainer logs, from rank 0.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from tideflow.checkpoint import Manifest
from tideflow.integrations._gang import GangCheckpoints

FRAMEWORK = "transformers"
RESUME_DIR = ".tideflow-resume"
STAGING_DIR = ".tideflow-staging"
# Trainer's one per-process file in a checkpoint folder; every other file is
# written once, by the main process, and is rank 0's to contribute.
_RANK_FILE = re.compile(r"^rng_state_(\d+)\.pth$")


def _file_rank(name: str) -> int | None:
    """The rank that writes file ``name`` of a checkpoint folder; None for rank 0's shared files."""
    match = _RANK_FILE.match(name)
    return int(match.group(1)) if match else None


class TideflowCallback(TrainerCallback):
    """Commits Trainer's checkpoints to the gang's store; stops on SIGTERM and on divergence.

    ``guard``: the logged metric the health guard watches (None: no guard).
    ``every_steps`` / ``every_seconds``: a save cadence for when the step's
    checkpoint policy sets none (the policy wins); without any, Trainer's own
    ``save_strategy`` decides.
    """

    def __init__(
        self,
        *,
        guard: str | None = "loss",
        every_steps: int | None = None,
        every_seconds: float | None = None,
    ) -> None:
        self.gang = GangCheckpoints(
            FRAMEWORK,
            every_steps=every_steps,
            every_seconds=every_seconds,
            default_every_seconds=None,
        )
        self.guard_metric = guard
        self.output_dir: str | None = None
        self._stopping = False  # every rank agreed to stop: the next save is the last

    # -- resuming ----------------------------------------------------------------------
    def restore(self, output_dir: str | os.PathLike[str] | None = None) -> str | None:
        """The local path of the newest committed checkpoint, downloaded; None if there is none.

        Pass it to ``trainer.train(resume_from_checkpoint=...)``. ``output_dir``
        defaults to the Trainer's (known once the Trainer is built with this
        callback).
        """
        base = Path(output_dir or self.output_dir or ".")
        rank = self.gang.rank

        def wanted(manifest: Manifest) -> list[str]:
            shared = [r.name for r in manifest.shards if _file_rank(r.name) is None]
            written_by = int(manifest.meta.get("world_size", self.gang.world_size))
            own = [f"rng_state_{rank}.pth"] if written_by > 1 and rank < written_by else []
            return shared + own

        restored = self.gang.restore_into(base / RESUME_DIR / f"rank-{rank}", wanted)
        return None if restored is None else str(restored[1])

    # -- Trainer's events ---------------------------------------------------------------
    def on_init_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.output_dir = args.output_dir

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # After the optimizer step: the one point of each step where every rank
        # agrees (one small all-reduce) on stopping and on a time-based save.
        stop, time_due = self.gang.agree(self.gang.watcher.requested, self.gang.time_due())
        step = state.global_step
        if stop:
            self._stopping = True
            control.should_save = True
            control.should_training_stop = True
        elif self.gang.manager is not None and (
            self.gang.due(step, time_due=time_due) or step >= state.max_steps
        ):
            # the policy's cadence, and the final state: the step's output
            control.should_save = True

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        values = {
            k: float(v)
            for k, v in (logs or {}).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        step = state.global_step
        self.gang.log_metrics(values, step)
        if self.guard_metric is None or self.guard_metric not in values:
            return
        # Trainer logs the same gathered value on every rank at the same steps,
        # so this collective runs on all of them. The save of this step comes
        # after the log: a bad step is never saved.
        reason = self.gang.check_health(step, values[self.guard_metric])
        (sick,) = self.gang.agree(bool(reason))
        if sick:
            self.gang.stop_unhealthy(step, reason or "another rank's guard tripped")

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        step = state.global_step
        assert args.output_dir is not None  # TrainingArguments sets one when not given
        # Trainer may save one step twice (an epoch's end): it is committed once.
        if self.gang.manager is not None and self.gang.saved_step != step:
            self._commit(Path(args.output_dir), step)
        if self._stopping:
            self.gang.stop_preempted(step)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._stopping:  # agreed to stop but Trainer saved nothing (save_strategy="best")
            self.gang.stop_preempted(state.global_step, committed=False)
        self.gang.finish()

    # -- internals ----------------------------------------------------------------------
    def _commit(self, output_dir: Path, step: int) -> None:
        folder = output_dir / f"{PREFIX_CHECKPOINT_DIR}-{step}"
        if not folder.is_dir():
            raise RuntimeError(f"Trainer saved step {step} but {folder} does not exist")
        rank = self.gang.rank
        mine: list[Path] = []
        for path in sorted(folder.iterdir()):
            if path.is_dir():
                raise NotImplementedError(
                    f"{path}: checkpoints with sub-folders (sharded FSDP or DeepSpeed "
                    "states) are not supported by tideflow's Trainer callback"
                )
            owner = _file_rank(path.name)
            if owner == rank or (owner is None and rank == 0):
                mine.append(path)
        # A private copy: Trainer deletes old checkpoint folders (save_total_limit)
        # and may rewrite one in place while the upload still reads it.
        staging = output_dir / STAGING_DIR / f"rank-{rank}" / f"step-{step}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        files = {}
        for path in mine:
            shutil.copyfile(path, staging / path.name)
            files[path.name] = staging / path.name
        self.gang.commit(step, files, block=self._stopping, cleanup=staging)
