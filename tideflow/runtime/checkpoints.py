"""Checkpoints for any training script, in a few lines.

    ckpt = tideflow.checkpoints(model=model, optimizer=optimizer, sampler=sampler)
    step = ckpt.restore()                 # 0, or the step of the newest committed checkpoint
    for ...:
        ...
        step += 1
        ckpt.save(step, metrics={"loss": loss.item()})
    ckpt.finish(step)

What a script gets for that, on every rank of a gang:

* **Crash-consistent checkpoints** in the gang's store (the step's ``checkpoint``
  policy: ``every_steps`` / ``every_seconds``, ``keep_last``, ``keep_best``),
  written asynchronously; a checkpoint is committed only when every rank's
  shard is in the store (``GangCommit``).
* **Exact resume.** ``restore()`` loads the newest committed checkpoint and each
  rank's RNG streams; ``tideflow.ResumableSampler`` resumes the data order at the
  sample where the run stopped (limits: ``tideflow.runtime.exact_resume``).
* **Checkpoint-before-evict.** SIGTERM (a preemption, the broker taking devices
  back, a node drain) is only recorded; at the next ``save`` every rank agrees,
  the current state is committed, and the process exits 75, which every
  tideflow backend resumes from that checkpoint.
* **The health guard** on the metric named ``guard`` (``loss`` by default): a
  non-finite or exploding value on any rank stops every rank at the same step
  without saving it, marks the newest committed checkpoint ``last-good`` and
  exits 76, which no backend restarts.

``save`` is called on every rank at the same steps, after the optimizer step (it
runs one small collective to agree on stopping and on time-based saves).
Outside a gang or without a checkpoint policy, the calls are cheap no-ops
apart from the guard and SIGTERM handling.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any, Protocol

import torch
import torch.distributed as dist

from tideflow import settings_registry as registry
from tideflow.checkpoint import CheckpointManager, Manifest
from tideflow.runtime.checkpointing import AsyncCheckpointer
from tideflow.runtime.config import EnvConfig
from tideflow.runtime.distributed import DistInfo
from tideflow.runtime.exact_resume import resume_caveat
from tideflow.runtime.hang_watchdog import HangWatchdog, configured_hang_timeout
from tideflow.runtime.health import HealthGuard, TrainingUnhealthy
from tideflow.runtime.metrics import MetricsLogger
from tideflow.runtime.preemption import EXIT_PREEMPTED, EXIT_UNHEALTHY, PreemptionWatcher
from tideflow.runtime.progress import ProgressFile
from tideflow.runtime.sampler import ResumableDistributedSampler, ResumableSampler
from tideflow.runtime.seeding import rng_state, set_rng_state

log = logging.getLogger("tideflow.runtime")

# Without every_steps or every_seconds in the step's policy, a checkpoint at
# least this often bounds the work a crash loses.
DEFAULT_EVERY_SECONDS = 600
OWN_KEY = "tideflow"  # the checkpoint's own entry: step and extras; not a user name


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any, /) -> Any: ...


def _unwrap(obj: Any) -> Any:
    """The module a DDP or ``torch.compile`` wrapper holds: its state has no prefix."""
    while True:
        if isinstance(obj, torch.nn.parallel.DistributedDataParallel):
            obj = obj.module
        elif hasattr(obj, "_orig_mod") and isinstance(obj, torch.nn.Module):
            obj = obj._orig_mod
        else:
            return obj


def _dist_info() -> DistInfo:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if dist.is_available() and dist.is_initialized():
        backend = str(dist.get_backend())
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if backend == "nccl"
            else torch.device("cpu")
        )
        return DistInfo(
            dist.get_rank(),
            dist.get_world_size(),
            int(os.environ.get("LOCAL_RANK", "0")),
            device,
            backend,
            registry.flag("TIDEFLOW_EMULATED"),
        )
    if world > 1:
        raise RuntimeError(
            f"this process is one of {world} workers (WORLD_SIZE={world}) but "
            "torch.distributed is not initialised: call "
            "torch.distributed.init_process_group() before tideflow.checkpoints()"
        )
    return DistInfo(0, 1, 0, torch.device("cpu"), None, False)


class Checkpoints:
    """One training script's checkpoints; see the module documentation."""

    def __init__(
        self,
        stateful: Mapping[str, Stateful],
        *,
        guard: str | None = "loss",
        every_steps: int | None = None,
        every_seconds: float | None = None,
        exit_on_stop: bool = True,
    ) -> None:
        for name, obj in stateful.items():
            if name == OWN_KEY:
                raise ValueError(f"'{OWN_KEY}' is tideflow's own entry; name the object otherwise")
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                hint = ""
                if isinstance(obj, torch.utils.data.Sampler):
                    hint = "; use tideflow.ResumableSampler, a DistributedSampler that resumes"
                raise TypeError(
                    f"tideflow.checkpoints({name}=...): a {type(obj).__name__} has no "
                    f"state_dict()/load_state_dict(){hint}"
                )
        self.stateful = {name: _unwrap(obj) for name, obj in stateful.items()}
        self.config = EnvConfig.from_env()
        self.dist = _dist_info()
        self.resume_caveat = resume_caveat(stateful, self.dist.world_size)
        self.exit_on_stop = exit_on_stop
        self.guard_metric = guard
        self.guard = HealthGuard()
        self.watcher = PreemptionWatcher().install()
        # The step's policy (the YAML) wins over the script's own choice.
        self.every_steps = self.config.checkpoint_every_steps or every_steps
        self.every_seconds = self.config.checkpoint_every_seconds or every_seconds
        if self.every_steps is None and self.every_seconds is None:
            self.every_seconds = DEFAULT_EVERY_SECONDS
        self.extra: dict[str, Any] = {}  # plain values saved and restored with the state
        self.metrics = MetricsLogger(is_main=self.dist.is_main)
        self.latest_metrics: dict[str, float] = {}
        self.exit_code: int | None = None  # 75 or 76 once a stop is agreed
        self.stop_reason = ""
        self.saved_step: int | None = None
        self.checkpointer: AsyncCheckpointer | None = None
        if self.config.checkpoint_uri:
            manager = CheckpointManager(
                self.config.checkpoint_uri,
                keep_last=self.config.keep_last,
                keep_best=self.config.keep_best,
            )
            self.checkpointer = AsyncCheckpointer(
                manager, self.dist, on_commit=self.metrics.log_checkpoint
            )
        self._last_save_time = time.monotonic()
        self.progress = ProgressFile()
        self.step = 0  # the last step offered to save()
        self._install_excepthook()
        self.watchdog = HangWatchdog(configured_hang_timeout(), self)

    # -- resuming -----------------------------------------------------------------
    def restore(self) -> int:
        """Load the newest committed checkpoint; the step it was taken at, or 0."""
        if self.checkpointer is None:
            self._say("no checkpoint store (TIDEFLOW_CHECKPOINT_URI unset): starting at step 0")
            return 0
        resumed = self.checkpointer.load_latest(elastic=self.config.elastic)
        if resumed is None:
            self._say(
                f"no committed checkpoint in {self.config.checkpoint_uri}: starting at step 0"
            )
            return 0
        step, shared, mine = resumed
        if missing := [name for name in self.stateful if name not in shared]:
            raise RuntimeError(
                f"checkpoint step {step} has no state for {missing}; it has "
                f"{sorted(k for k in shared if k != OWN_KEY)}: pass the same names to "
                "tideflow.checkpoints() as the run that wrote it"
            )
        for name, obj in self.stateful.items():
            if isinstance(obj, (ResumableSampler, ResumableDistributedSampler)):
                obj.load_state_dict(shared[name], elastic=self.config.elastic)
            else:
                obj.load_state_dict(shared[name])
        own = shared.get(OWN_KEY, {})
        self.extra = dict(own.get("extra", {}))
        self.latest_metrics = dict(own.get("metrics", {}))
        if "rng" in mine:
            set_rng_state(mine["rng"])
        self.saved_step = step
        self.watchdog.progressed()  # loading a big checkpoint is progress
        self._say(f"resumed from checkpoint step {step} (restart {self.config.restart_count})")
        self._say(self.resume_caveat or "")
        return int(step)

    # -- saving ---------------------------------------------------------------------
    def save(self, step: int, metrics: Mapping[str, float] | None = None) -> bool:
        """Offer the state after ``step``; write it when the policy says. True if written.

        Also the place where every rank agrees to stop: on SIGTERM the state is
        committed and the process exits 75; when the guard trips, 76 (no save).
        With ``exit_on_stop=False`` it returns instead and ``should_stop()`` is True.
        """
        self.step = step
        self.progress.record(step)
        self.watchdog.progressed()
        values = {k: float(v) for k, v in (metrics or {}).items()}
        self.latest_metrics.update(values)
        if values:
            self.metrics.log_metrics(values, step)
        unhealthy = ""
        if self.guard_metric is not None and self.guard_metric in values:
            try:
                self.guard.check_loss(step, values[self.guard_metric])
            except TrainingUnhealthy as exc:
                unhealthy = str(exc)
        time_due = (
            self.every_seconds is not None
            and time.monotonic() - self._last_save_time >= self.every_seconds
        )
        stop, sick, due_by_time = self._agree(self.watcher.requested, bool(unhealthy), time_due)
        if sick:
            self._stop_unhealthy(step, unhealthy or "another rank's guard tripped")
            return False
        if stop:
            self._write(step, block=True)
            self._stop_preempted(step)
            return True
        due = due_by_time or (self.every_steps is not None and step % self.every_steps == 0)
        if due:
            self._write(step, block=False)
        return due

    def finish(self, step: int, metrics: Mapping[str, float] | None = None) -> Manifest | None:
        """Commit the final state (unless ``step`` is already saved) and wait for it."""
        self.watchdog.stop()  # the last commit may take long; it is not a hang
        values = {k: float(v) for k, v in (metrics or {}).items()}
        self.latest_metrics.update(values)
        if values:
            self.metrics.log_metrics(values, step)
        if self.saved_step != step:
            self._write(step, block=True)
        manifest = self.checkpointer.finalize() if self.checkpointer else None
        self.metrics.close(succeeded=True)
        return manifest

    def should_stop(self) -> bool:
        """True once every rank agreed to stop (only seen with ``exit_on_stop=False``)."""
        return self.exit_code is not None

    # -- internals ------------------------------------------------------------------
    def _install_excepthook(self) -> None:
        """Record the step an escaping exception failed at, exactly (the supervisor
        compares it across restarts to spot a failure that will only repeat)."""
        previous = sys.excepthook

        def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
            with contextlib.suppress(OSError):
                self.progress.record(self.step, force=True)
            previous(kind, value, tb)

        sys.excepthook = hook

    def _agree(self, *flags: bool) -> tuple[bool, ...]:
        """Each flag, True on every rank if it is True on any (one small all-reduce)."""
        if self.dist.backend is None:
            return flags
        values = torch.tensor([1 if f else 0 for f in flags], device=self.dist.device)
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
        return tuple(bool(v) for v in values.tolist())

    def _state(self, step: int) -> dict[str, Any]:
        state: dict[str, Any] = {name: obj.state_dict() for name, obj in self.stateful.items()}
        state[OWN_KEY] = {"step": step, "extra": dict(self.extra)}
        return state

    def _write(self, step: int, *, block: bool) -> None:
        self._last_save_time = time.monotonic()
        if self.checkpointer is None or self.saved_step == step:
            return
        self.checkpointer.save(
            step,
            self._state(step),
            rank_state={"rng": rng_state()},
            metrics=dict(self.latest_metrics),
            block=block,
        )
        self.saved_step = step

    def _stop_preempted(self, step: int) -> None:
        manifest = self.checkpointer.finalize() if self.checkpointer else None
        where = manifest.uri if manifest else "(rank 0 commits it)"
        if self.checkpointer is None:
            where = "none: no checkpoint store"
        self._say(
            f"preempted ({self.watcher.signal_name or 'by a peer'}) at step {step}; "
            f"checkpoint {where}; exiting {EXIT_PREEMPTED} to resume from it",
            always=True,
        )
        self.metrics.close(succeeded=None)
        self._stop(EXIT_PREEMPTED, "preempted")

    def _stop_unhealthy(self, step: int, reason: str) -> None:
        good = self.checkpointer.mark_last_good() if self.checkpointer else None
        marked = (
            f"last good checkpoint: step {good}"
            if self.dist.is_main
            else "rank 0 marks the last good checkpoint"
        )
        self._say(
            f"training-health guard stopped the run at step {step}: {reason}; {marked}",
            always=True,
        )
        self.metrics.set_tags({"tideflow.health": reason, "tideflow.last_good_step": str(good)})
        self.metrics.close(succeeded=False)
        self._stop(EXIT_UNHEALTHY, reason)

    def _stop(self, code: int, reason: str) -> None:
        self.watchdog.stop()
        self.exit_code = code
        self.stop_reason = reason
        if self.exit_on_stop:
            raise SystemExit(code)

    def _say(self, text: str, *, always: bool = False) -> None:
        if text and (always or self.dist.is_main):
            print(f"tideflow: rank {self.dist.rank}: {text}", file=sys.stderr, flush=True)


def checkpoints(
    *,
    guard: str | None = "loss",
    every_steps: int | None = None,
    every_seconds: float | None = None,
    exit_on_stop: bool = True,
    **stateful: Stateful,
) -> Checkpoints:
    """Checkpoints for the objects named by keyword (anything with ``state_dict()``).

    ``guard``: the metric passed to ``save`` that the health guard watches (None:
    no guard). ``every_steps`` / ``every_seconds``: how often to save when the
    step's checkpoint policy says nothing (it wins); 600 s without either.
    ``exit_on_stop``: exit 75/76 from ``save`` when the gang must stop (default),
    or return and let the script read ``should_stop()`` and ``exit_code``.
    """
    return Checkpoints(
        stateful,
        guard=guard,
        every_steps=every_steps,
        every_seconds=every_seconds,
        exit_on_stop=exit_on_stop,
    )
