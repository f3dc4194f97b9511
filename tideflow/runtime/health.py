"""Training-health guard: stop early on NaN/inf, an exploding loss, or a stalled metric."""

from __future__ import annotations

import math
import statistics
from collections import deque


class TrainingUnhealthy(Exception):  # noqa: N818 - the state, not an error class
    """Base: the run should stop, and the last good checkpoint be kept."""


class TrainingDiverged(TrainingUnhealthy):
    pass


class TrainingStalled(TrainingUnhealthy):
    pass


class HealthGuard:
    def __init__(
        self,
        *,
        explode_factor: float = 10.0,
        window: int = 50,
        warmup: int = 1,
        patience_evals: int | None = None,
        min_delta: float = 0.0,
        mode: str = "max",
    ) -> None:
        self.explode_factor = explode_factor
        self.warmup = warmup
        self.recent: deque[float] = deque(maxlen=window)
        self.patience_evals = patience_evals
        self.min_delta = min_delta
        self.mode = mode
        self.best: float | None = None
        self.evals_since_best = 0

    def check_loss(self, step: int, loss: float) -> None:
        if not math.isfinite(loss):
            raise TrainingDiverged(f"loss is {loss} at step {step}")
        if len(self.recent) >= self.warmup:
            median = statistics.median(self.recent)
            if median > 0 and loss > self.explode_factor * median:
                raise TrainingDiverged(
                    f"loss exploded at step {step}: {loss:.4g} is more than "
                    f"{self.explode_factor:g}x the running median {median:.4g}"
                )
        self.recent.append(loss)

    def check_eval(self, step: int, value: float) -> None:
        """Raise after ``patience_evals`` evaluations without an improvement of ``min_delta``."""
        better = self.best is None or (
            value > self.best + self.min_delta
            if self.mode == "max"
            else value < self.best - self.min_delta
        )
        if better:
            self.best = value
            self.evals_since_best = 0
            return
        self.evals_since_best += 1
        if self.patience_evals is not None and self.evals_since_best >= self.patience_evals:
            raise TrainingStalled(
                f"no improvement at step {step}: {self.evals_since_best} evaluations without "
                f"beating {self.best:.4g} by {self.min_delta:g} (latest {value:.4g})"
            )
