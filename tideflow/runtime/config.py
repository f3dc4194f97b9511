"""What the operator tells a training process, through environment variables."""

from __future__ import annotations

from dataclasses import dataclass

from tideflow import settings_registry as registry


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
        metric = registry.optional_text("TIDEFLOW_KEEP_BEST_METRIC")
        return cls(
            checkpoint_uri=registry.optional_text("TIDEFLOW_CHECKPOINT_URI"),
            checkpoint_every_steps=registry.optional_whole("TIDEFLOW_CHECKPOINT_EVERY_STEPS"),
            checkpoint_every_seconds=registry.optional_whole("TIDEFLOW_CHECKPOINT_EVERY_SECONDS"),
            keep_last=registry.whole("TIDEFLOW_KEEP_LAST"),
            keep_best=(metric, registry.text("TIDEFLOW_KEEP_BEST_MODE")) if metric else None,
            device_class=registry.text("TIDEFLOW_DEVICE_CLASS"),
            emulated=registry.flag("TIDEFLOW_EMULATED"),
            restart_count=registry.whole("TIDEFLOW_RESTART_COUNT"),
            min_workers=registry.optional_whole("TIDEFLOW_MIN_WORKERS"),
        )
