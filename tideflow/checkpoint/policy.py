"""A gang step's checkpoint policy as the environment its workers' runtime reads."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def checkpoint_env(checkpoint: Mapping[str, Any], uri: str) -> dict[str, str]:
    """The step's ``checkpoint`` policy and its store ``uri`` as ``TIDEFLOW_*`` variables."""
    env = {"TIDEFLOW_CHECKPOINT_URI": uri, "TIDEFLOW_KEEP_LAST": str(checkpoint["keep_last"])}
    if checkpoint.get("every_steps"):
        env["TIDEFLOW_CHECKPOINT_EVERY_STEPS"] = str(checkpoint["every_steps"])
    if checkpoint.get("every_seconds"):
        env["TIDEFLOW_CHECKPOINT_EVERY_SECONDS"] = str(checkpoint["every_seconds"])
    best = checkpoint.get("keep_best")
    if best:
        env["TIDEFLOW_KEEP_BEST_METRIC"] = best["metric"]
        env["TIDEFLOW_KEEP_BEST_MODE"] = best["mode"]
    return env
