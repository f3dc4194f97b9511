"""The hang watchdog: a worker whose training loop stopped progressing exits 77."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import threading
import time
from typing import Protocol

from tideflow import settings_registry as registry
from tideflow.config import EXIT_HUNG, HANG_TIMEOUT_ENV
from tideflow.runtime.distributed import DistInfo
from tideflow.runtime.progress import ProgressFile

__all__ = ["HangWatchdog", "WatchedLoop", "configured_hang_timeout"]


class WatchedLoop(Protocol):
    """What the watchdog reads of the training loop it watches (``Checkpoints``)."""

    @property
    def dist(self) -> DistInfo: ...

    @property
    def step(self) -> int: ...

    @property
    def progress(self) -> ProgressFile: ...


def configured_hang_timeout() -> float | None:
    """The step's ``hang_timeout`` in seconds, as its workers are given it; None: no watchdog."""
    return registry.optional_number(HANG_TIMEOUT_ENV)


class HangWatchdog:
    """Calls the worker hung when ``save`` has not been called for ``timeout_s``.

    A thread, because a hung training loop calls nothing: it dumps every thread's
    stack to the worker's log (what a hang needs to be understood), records the
    step, and exits 77 so the backend restarts the gang (and fails it when the
    restart hangs at the same step, ``tideflow.backends.failures``). A hang inside
    C code that holds the GIL starves this thread too; the step's timeout ends it.
    """

    def __init__(self, timeout_s: float | None, owner: WatchedLoop) -> None:
        self.timeout_s = timeout_s
        self.owner = owner
        self.last = time.monotonic()
        self._stopped = threading.Event()
        if timeout_s is not None:
            threading.Thread(target=self._watch, name="tideflow-hang-watchdog", daemon=True).start()

    def progressed(self) -> None:
        self.last = time.monotonic()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        assert self.timeout_s is not None
        while not self._stopped.wait(min(5.0, self.timeout_s / 4)):
            idle = time.monotonic() - self.last
            if idle < self.timeout_s:
                continue
            owner = self.owner
            print(
                f"tideflow: rank {owner.dist.rank}: no training progress for {idle:.0f}s "
                f"(hang_timeout {self.timeout_s:.0f}s; last step {owner.step}): the stacks of "
                f"its threads follow; exiting {EXIT_HUNG}",
                file=sys.stderr,
                flush=True,
            )
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            with contextlib.suppress(OSError):
                owner.progress.record(owner.step, force=True)
            sys.stderr.flush()
            os._exit(EXIT_HUNG)  # the main thread is stuck: no clean shutdown is possible
