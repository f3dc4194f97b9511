"""What an evaluation step does besides choosing its device (no Airflow).

Shared by ``EvaluationOperator`` and the standalone executor: which checkpoint
facts reach the entry point, how its declared metrics are read back, and how a
gang step's checkpoint is found from its store when no XCom carries it (Argo).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tideflow.steps.entrypoints import StepError, describe

CHECKPOINT_KEYS = ("checkpoint", "checkpoint_store", "checkpoint_step", "checkpoint_checksum")


def checkpoint_facts(upstream: Mapping[str, Any]) -> dict[str, Any]:
    """The checkpoint keys of a gang step's outputs (its XCom), and nothing else."""
    return {k: upstream[k] for k in CHECKPOINT_KEYS if k in upstream}


def entrypoint_args(checkpoint: Mapping[str, Any], args: Mapping[str, Any]) -> dict[str, Any]:
    """The entry point's keyword arguments: the checkpoint facts, then the step's own args.

    The checksum stays out: entry points verify shards against the manifest.
    """
    facts = {k: v for k, v in checkpoint.items() if k != "checkpoint_checksum"}
    return {**facts, **args}


def declared_metrics(
    step: str, entrypoint: str | Sequence[str], declared: Sequence[str], returned: Mapping[str, Any]
) -> dict[str, float]:
    missing = [m for m in declared if m not in returned]
    if missing:
        raise StepError(
            f"step '{step}': {describe(entrypoint)} did not return declared metric(s) {missing}"
        )
    return {m: float(returned[m]) for m in declared}


def find_checkpoint(store: str, step: int | None = None) -> dict[str, Any]:
    """The checkpoint facts of the newest committed checkpoint in ``store`` (or of ``step``).

    "Newest" is the newest whose manifest is committed and valid and whose
    shards verify, so a half-written or damaged checkpoint is never evaluated
    or promoted; a named ``step`` that is not so fails with the reason.
    """
    from tideflow.checkpoint import CheckpointError, CheckpointManager

    manager = CheckpointManager(store)
    try:
        manifest = manager.latest() if step is None else manager.load(step)
    except CheckpointError as exc:
        raise StepError(str(exc)) from exc
    if manifest is None:
        raise StepError(f"no committed checkpoint in {store}")
    return {
        "checkpoint": manifest.uri,
        "checkpoint_store": store,
        "checkpoint_step": manifest.step,
        "checkpoint_checksum": manifest.checksum,
    }
