"""What the operator tells a training process, through environment variables."""

from __future__ import annotations

import os
from dataclasses import dataclass


def _int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


@dataclass(frozen=True)
class EnvConfig:
    checkpoint_uri: str | None
    checkpoint_every_steps: int | None
    checkpoint_every_seconds: int | None
    keep_last: int
    keep_best: tuple[str, str] | None
    device_class: str
    emulated: bool
    restart_count: int
    # Elastic gangs: the fewest workers it may run with; resuming on a different
    # number of workers than the checkpoint was written by is then allowed.
    min_workers: int | None = None

    @property
    def elastic(self) -> bool:
        return self.min_workers is not None

    @classmethod
    def from_env(cls) -> EnvConfig:
        metric = os.environ.get("TIDEFLOW_KEEP_BEST_METRIC")
        return cls(
            checkpoint_uri=os.environ.get("TIDEFLOW_CHECKPOINT_URI"),
            checkpoint_every_steps=_int("TIDEFLOW_CHECKPOINT_EVERY_STEPS"),
            checkpoint_every_seconds=_int("TIDEFLOW_CHECKPOINT_EVERY_SECONDS"),
            keep_last=_int("TIDEFLOW_KEEP_LAST") or 3,
            keep_best=(metric, os.environ.get("TIDEFLOW_KEEP_BEST_MODE", "max"))
            if metric
            else None,
            device_class=os.environ.get("TIDEFLOW_DEVICE_CLASS", "cpu"),
            emulated=os.environ.get("TIDEFLOW_EMULATED") == "1",
            restart_count=_int("TIDEFLOW_RESTART_COUNT") or 0,
            min_workers=_int("TIDEFLOW_MIN_WORKERS"),
        )
