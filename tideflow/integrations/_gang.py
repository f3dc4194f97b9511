"""What the framework integrations share: a gang's checkpoints made of a framework's files.

A framework (HF Trainer, Lightning) writes its own checkpoint files to local
disk; this class puts them in the gang's store as one tideflow checkpoint:
each rank contributes the files it owns through ``GangCommit`` and rank 0
commits the manifest once every rank's receipt is in. The upload runs on a
background thread, so training waits only for the local save. It also holds
the rest of the contract every integration keeps: restoring the newest
committed checkpoint into a local directory (checksums verified), agreeing
across ranks on stopping, the training-health guard, and the step's MLflow run.

Nothing here imports a training framework.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist

from tideflow.checkpoint import CheckpointManager, Manifest
from tideflow.runtime.checkpoints import DEFAULT_EVERY_SECONDS
from tideflow.runtime.config import EnvConfig
from tideflow.runtime.gang_commit import GangCommit
from tideflow.runtime.health import HealthGuard, TrainingUnhealthy
from tideflow.runtime.metrics import MetricsLogger
from tideflow.runtime.preemption import EXIT_PREEMPTED, EXIT_UNHEALTHY, PreemptionWatcher

log = logging.getLogger("tideflow.integrations")

# The manifest's meta names the framework whose files the checkpoint holds, so
# one framework never resumes from another's checkpoint in a shared store.
FRAMEWORK_META = "framework"


def rank_and_world() -> tuple[int, int]:
    """This process's rank and the gang's size: the process group's, else torchrun's env.

    The integrations are created before the framework joins the process group
    (Lightning does so inside ``fit``), and every tideflow backend sets
    torchrun's ``RANK`` and ``WORLD_SIZE`` for each worker.
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


class GangCheckpoints:
    """One rank's side of a framework's checkpoints in the gang's store."""

    def __init__(
        self,
        framework: str,
        *,
        every_steps: int | None = None,
        every_seconds: float | None = None,
        default_every_seconds: float | None = DEFAULT_EVERY_SECONDS,
    ) -> None:
        self.framework = framework
        self.config = EnvConfig.from_env()
        self.rank, self.world_size = rank_and_world()
        # Only records SIGTERM; the training loop stops at the next step every rank agrees on.
        self.watcher = PreemptionWatcher().install()
        self.guard = HealthGuard()
        self.metrics = MetricsLogger(is_main=self.rank == 0)
        # The step's policy (the YAML) wins over the script's own choice.
        self.every_steps = self.config.checkpoint_every_steps or every_steps
        self.every_seconds = self.config.checkpoint_every_seconds or every_seconds
        if self.every_steps is None and self.every_seconds is None:
            self.every_seconds = default_every_seconds
        self.manager: CheckpointManager | None = None
        if self.config.checkpoint_uri:
            self.manager = CheckpointManager(
                self.config.checkpoint_uri,
                keep_last=self.config.keep_last,
                keep_best=self.config.keep_best,
            )
        self.latest_metrics: dict[str, float] = {}
        self.saved_step: int | None = None  # the newest step handed to the store
        self.last_committed: Manifest | None = None  # rank 0: what it committed last
        self.exit_code: int | None = None
        self._last_save_time = time.monotonic()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    # -- cadence and agreement -------------------------------------------------------
    def due(self, step: int, *, time_due: bool) -> bool:
        """Whether the policy asks for a checkpoint after ``step`` (time agreed by the caller)."""
        if self.saved_step == step:
            return False
        return time_due or (self.every_steps is not None and step % self.every_steps == 0)

    def time_due(self) -> bool:
        return (
            self.every_seconds is not None
            and time.monotonic() - self._last_save_time >= self.every_seconds
        )

    def agree(self, *flags: bool) -> tuple[bool, ...]:
        """Each flag, True on every rank if it is True on any (one small all-reduce).

        Called by every rank at the same point of the same step, so all ranks
        stop, or save, at the same step.
        """
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return flags
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if dist.get_backend() == "nccl"
            else torch.device("cpu")
        )
        values = torch.tensor([1 if f else 0 for f in flags], device=device)
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
        return tuple(bool(v) for v in values.tolist())

    def check_health(self, step: int, loss: float | None) -> str:
        """Why training is unhealthy at ``step`` on this rank, or ``""``."""
        if loss is None:
            return ""
        try:
            self.guard.check_loss(step, loss)
        except TrainingUnhealthy as exc:
            return str(exc)
        return ""

    def log_metrics(self, values: Mapping[str, float], step: int) -> None:
        numbers = {k: float(v) for k, v in values.items()}
        self.latest_metrics.update(numbers)
        if numbers:
            self.metrics.log_metrics(numbers, step)

    # -- saving ------------------------------------------------------------------------
    def commit(
        self,
        step: int,
        files: Mapping[str, Path],
        *,
        block: bool,
        cleanup: Path | None = None,
    ) -> None:
        """Hand this rank's ``files`` of ``step`` to the store; rank 0 commits the checkpoint.

        ``files`` maps shard names (plain file names) to local files that stay
        unchanged until the upload ends; ``cleanup`` is deleted after it. The
        previous upload is waited for first: one is in flight at a time.
        """
        self.wait()
        self._last_save_time = time.monotonic()
        self.saved_step = step
        if self.manager is None:
            if cleanup is not None:
                shutil.rmtree(cleanup, ignore_errors=True)
            return
        self._thread = threading.Thread(
            target=self._upload,
            args=(step, dict(files), dict(self.latest_metrics), cleanup),
            name=f"tideflow-{self.framework}-checkpoint-{step}",
            daemon=True,
        )
        self._thread.start()
        if block:
            self.wait()

    def _upload(
        self,
        step: int,
        files: dict[str, Path],
        metrics: dict[str, float],
        cleanup: Path | None,
    ) -> None:
        assert self.manager is not None
        try:
            gang = GangCommit(self.manager, rank=self.rank, world_size=self.world_size)
            # Not tideflow's model.pt + rank-R.pt layout: no world_size in the
            # manifest; GangCommit records the number of ranks in meta.
            manifest = gang.commit(
                step, files, metrics=metrics, meta={FRAMEWORK_META: self.framework}
            )
            if manifest is not None:  # rank 0 committed it
                self.last_committed = manifest
                # As tideflow.checkpoints(): the checkpoint resumed from (often the
                # preemption's) counts toward keep_last; the newer one just committed
                # is what a restart resumes from, and retention never deletes it.
                self.manager.apply_retention()
                self.metrics.log_checkpoint(manifest)
                log.info("tideflow: checkpoint step %d committed: %s", step, manifest.uri)
            if cleanup is not None:
                shutil.rmtree(cleanup, ignore_errors=True)
        except BaseException as exc:  # surfaced to the training loop by wait()
            self._error = exc

    def wait(self) -> None:
        """Wait for the upload in flight; raise what it failed with."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"writing a checkpoint to the store failed: {error}") from error

    # -- resuming ----------------------------------------------------------------------
    def restore_into(
        self, dest: Path, wanted: Callable[[Manifest], list[str]]
    ) -> tuple[Manifest, Path] | None:
        """Download the newest committed checkpoint's shards this rank needs into ``dest``.

        ``wanted(manifest)`` names them. Every rank picks the same checkpoint:
        the newest whose shards all verify (the whole checkpoint is checked, not
        only this rank's part), written by this framework and this gang's size
        (another size only when the gang is elastic). None when there is none.
        """
        if self.manager is None:
            self.say("no checkpoint store (TIDEFLOW_CHECKPOINT_URI unset): starting from scratch")
            return None

        def problems(manifest: Manifest) -> list[str]:
            framework = manifest.meta.get(FRAMEWORK_META)
            if framework != self.framework:
                return [f"it holds {framework or 'tideflow'} files, not {self.framework}'s"]
            names = {record.name for record in manifest.shards}
            return [
                f"it has no shard {n}, needed to resume" for n in wanted(manifest) if n not in names
            ]

        manifest = self.manager.latest(require=problems)
        if manifest is None:
            self.say(f"no committed checkpoint in {self.manager.uri}: starting from scratch")
            return None
        written_by = int(manifest.meta.get("world_size", self.world_size))
        if written_by != self.world_size and not self.config.elastic:
            raise RuntimeError(
                f"checkpoint step {manifest.step} was written by {written_by} ranks, this gang "
                f"has {self.world_size}: resuming would change the data order"
            )
        target = dest / f"step-{manifest.step}"
        shutil.rmtree(target, ignore_errors=True)  # a partial download of an earlier attempt
        target.mkdir(parents=True)
        for name in wanted(manifest):
            self.manager.download_shard(manifest, name, target / name)  # checksum verified
        self.saved_step = manifest.step
        self.say(
            f"resumed from checkpoint step {manifest.step} (restart {self.config.restart_count})"
        )
        return manifest, target

    # -- stopping ----------------------------------------------------------------------
    def stop_preempted(self, step: int, *, committed: bool = True) -> NoReturn:
        """Wait for the checkpoint of ``step`` to be committed, then exit 75 (resumable)."""
        self.wait()
        if self.manager is None:
            where = "none: no checkpoint store"
        elif not committed:
            where = f"none at this step; the newest committed is step {self.saved_step}"
        elif self.last_committed is not None and self.last_committed.step == step:
            where = self.last_committed.uri
        else:
            where = "(rank 0 commits it)"
        self.say(
            f"preempted ({self.watcher.signal_name or 'by a peer'}) at step {step}; "
            f"checkpoint {where}; exiting {EXIT_PREEMPTED} to resume from it",
            always=True,
        )
        self.metrics.close(succeeded=None)
        self.exit_code = EXIT_PREEMPTED
        raise SystemExit(EXIT_PREEMPTED)

    def stop_unhealthy(self, step: int, reason: str) -> NoReturn:
        """Mark the newest committed checkpoint ``last-good`` (rank 0) and exit 76."""
        self.wait()
        good: int | None = None
        if self.manager is not None and self.rank == 0:
            manifest = self.last_committed or self.manager.latest()
            if manifest is not None:
                good = manifest.step
                self.manager.mark(good, "last-good")
        marked = (
            f"last good checkpoint: step {good}"
            if self.rank == 0
            else "rank 0 marks the last good checkpoint"
        )
        self.say(
            f"training-health guard stopped the run at step {step}: {reason}; {marked}",
            always=True,
        )
        self.metrics.set_tags({"tideflow.health": reason, "tideflow.last_good_step": str(good)})
        self.metrics.close(succeeded=False)
        self.exit_code = EXIT_UNHEALTHY
        raise SystemExit(EXIT_UNHEALTHY)

    def finish(self) -> None:
        """Wait for the last upload and deliver the metrics: training ended well."""
        self.wait()
        self.metrics.close(succeeded=True)

    def say(self, text: str, *, always: bool = False) -> None:
        if always or self.rank == 0:
            print(f"tideflow: rank {self.rank}: {text}", file=sys.stderr, flush=True)
