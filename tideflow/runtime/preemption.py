"""SIGTERM means "checkpoint and leave": finish the step, commit, exit 75 (resumable)."""

from __future__ import annotations

import signal
from types import FrameType

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: try again later; the gang backend treats it as resumable
EXIT_UNHEALTHY = 76  # stopped by the training-health guard; restarting would not help


class PreemptionWatcher:
    """Only records the request; the training loop decides when it is safe to stop."""

    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""

    def install(self) -> PreemptionWatcher:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        self.signal_name = signal.Signals(signum).name
