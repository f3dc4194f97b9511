"""What a finished gang step hands downstream: its store and newest committed checkpoint.

A gang step exists to produce a checkpoint: evaluation and promotion read it.
A gang whose script ended well but committed none fails the step here, saying
what the script must call, instead of leaving promotion to fail later without a
hint; a step that declares its checkpoint ``optional`` only warns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Required, TypedDict

from tideflow.checkpoint import CheckpointManager
from tideflow.gangs.resolved import ResolvedGang


class NoCheckpointError(RuntimeError):
    """The gang succeeded without committing the checkpoint its step requires."""


def no_checkpoint_message(gang: ResolvedGang) -> str:
    return (
        f"step '{gang.step}': the gang succeeded but committed no checkpoint to "
        f"{gang.store}. The training script must save through tideflow: "
        "`ckpt = tideflow.checkpoints(model=model, optimizer=optimizer)`, "
        "`ckpt.save(step, metrics={...})` in the loop and `ckpt.finish(step)` at the end "
        "(docs/how-to/own-script.md). A step whose script keeps its "
        "model elsewhere declares `checkpoint: {optional: true}`."
    )


class GangOutputs(TypedDict, total=False):
    """What a gang step hands downstream (XCom, or Argo's output parameters)."""

    checkpoint_store: Required[str]
    checkpoint: Required[str]  # the newest committed checkpoint's URI; "" when none
    checkpoint_step: Required[int | str]  # its step; "" when none
    checkpoint_checksum: str
    metrics: dict[str, float]
    restarts: int  # the operator's: how often the gang restarted, and its device-hours
    device_hours: float


def gang_outputs(gang: ResolvedGang, *, warn: Callable[[str], None]) -> GangOutputs:
    """``checkpoint_store`` and, from the newest committed checkpoint, ``checkpoint``,
    ``checkpoint_step``, ``checkpoint_checksum`` and ``metrics``.

    Raises ``NoCheckpointError`` when there is none and the step requires one.
    """
    outputs: GangOutputs = {
        "checkpoint_store": gang.store,
        "checkpoint": "",
        "checkpoint_step": "",
    }
    manifest = CheckpointManager(gang.store).latest()
    if manifest is not None:
        outputs["checkpoint"] = manifest.uri
        outputs["checkpoint_step"] = manifest.step
        outputs["checkpoint_checksum"] = manifest.checksum
        outputs["metrics"] = manifest.metrics
    elif gang.checkpoint_optional:
        warn(f"tideflow: {no_checkpoint_message(gang)} (declared optional: going on)")
    else:
        raise NoCheckpointError(no_checkpoint_message(gang))
    return outputs
