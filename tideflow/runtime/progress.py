"""A worker's training progress, for the supervisor (``tideflow.backends.failures``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tideflow import settings_registry as registry
from tideflow.config import PROGRESS_FILE_ENV

MIN_INTERVAL_S = 1.0  # a file write per step would cost more than the step on a small model


class ProgressFile:
    """Records the last step reached: at most once a second, unless ``force``d (the
    runtime forces it when an exception escapes the script, so the step it failed at
    is the one recorded)."""

    def __init__(self, path: str | None = None) -> None:
        chosen = path if path is not None else registry.optional_text(PROGRESS_FILE_ENV)
        self.path = Path(chosen) if chosen else None
        self._written_at = 0.0

    def record(self, step: int, *, force: bool = False) -> None:
        if self.path is None:
            return
        now = time.monotonic()
        if not force and now - self._written_at < MIN_INTERVAL_S:
            return
        self._written_at = now
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"step": step, "at": time.time()}))
        os.replace(tmp, self.path)
