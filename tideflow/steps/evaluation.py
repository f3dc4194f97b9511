"""What an evaluation step does besides choosing its device (no Airflow).

Shared by ``EvaluationOperator`` and the standalone executor: which checkpoint
of the gang step is evaluated (``select_checkpoint``: the best by the gang's
``keep_best`` metric, or the latest), which checkpoint facts reach the entry
point, how its declared metrics are read back, and how a gang step's
checkpoint is found from its store when no XCom carries it (Argo).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tideflow.steps.entrypoints import StepError, describe

if TYPE_CHECKING:
    from tideflow.checkpoint.manifest import Manifest

CHECKPOINT_KEYS = ("checkpoint", "checkpoint_store", "checkpoint_step", "checkpoint_checksum")
CHECKPOINT_CHOICES = ("best", "latest")
DEFAULT_CHECKPOINT_CHOICE = "best"  # as tideflow.spec.step_kinds.Evaluation.checkpoint
# The evaluation's output (and XCom key) that tells promotion how its checkpoint was chosen.
SELECTION_OUTPUT = "checkpoint_selection"


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
    return _facts(manifest, store)


@dataclass(frozen=True)
class Selection:
    """The checkpoint an evaluation scores, and why that one."""

    facts: dict[str, Any]  # CHECKPOINT_KEYS of the chosen checkpoint
    choice: str  # what the step asked for: best or latest
    selected: str  # what it got: best, or latest (asked for, or the fallback)
    reason: str

    def record(self) -> dict[str, Any]:
        """For the step's outputs: promotion turns it into its lineage tags."""
        return {
            "choice": self.choice,
            "selected": self.selected,
            "step": self.facts.get("checkpoint_step", ""),
            "reason": self.reason,
        }

    def tags(self) -> dict[str, str]:
        return selection_tags(self.record())


def selection_tags(record: Mapping[str, Any] | None) -> dict[str, str]:
    """``Selection.record()`` as MLflow tags (nothing for an absent or foreign record)."""
    if not isinstance(record, Mapping) or not record.get("choice"):
        return {}
    tags = {
        "tideflow.checkpoint_choice": str(record["choice"]),
        "tideflow.checkpoint_selected": str(record.get("selected", "")),
        "tideflow.checkpoint_reason": str(record.get("reason", ""))[:4900],
    }
    if record.get("step") not in (None, ""):
        tags["tideflow.checkpoint_step"] = str(record["step"])
    return tags


def _facts(manifest: Any, store: str) -> dict[str, Any]:
    return {
        "checkpoint": manifest.uri,
        "checkpoint_store": store,
        "checkpoint_step": manifest.step,
        "checkpoint_checksum": manifest.checksum,
    }


def select_checkpoint(
    store: str,
    choice: str,
    keep_best: Mapping[str, Any] | None,
    *,
    latest: Mapping[str, Any] | None = None,
    log: Callable[[str], None] = lambda _line: None,
) -> Selection:
    """The checkpoint of the gang step's ``store`` to evaluate.

    ``best``: among the committed checkpoints whose ``keep_best`` metric is a
    finite number, the best by it (``mode`` max or min; of equals the earliest,
    the one retention keeps), its shards verified (a damaged candidate is
    skipped, saying why). Without ``keep_best``, or with no checkpoint that
    carries its metric or verifies, the latest, and the log says why.
    ``latest``: the gang step's newest committed checkpoint: ``latest`` when the
    caller has it (the gang's outputs), else the newest one in ``store`` that
    verifies. ``StepError`` when there is none.
    """
    if choice not in CHECKPOINT_CHOICES:
        raise StepError(
            f"checkpoint: {choice!r} is not one of {', '.join(CHECKPOINT_CHOICES)}", final=True
        )

    def newest(reason: str) -> Selection:
        facts = dict(latest) if latest is not None else find_checkpoint(store)
        facts = {k: facts[k] for k in CHECKPOINT_KEYS if k in facts}
        log(f"tideflow: checkpoint: latest (step {facts.get('checkpoint_step')}): {reason}")
        return Selection(facts, choice, "latest", reason)

    if choice == "latest":
        return newest("the step asks for the latest checkpoint")
    metric = str((keep_best or {}).get("metric") or "")
    if not metric:
        return newest("checkpoint: best, but the gang step declares no checkpoint.keep_best")
    mode = str((keep_best or {}).get("mode") or "max")
    best, reason = _best_verified(store, metric, mode, log)
    if best is None:
        return newest(reason)
    log(f"tideflow: checkpoint: {reason}")
    return Selection(_facts(best, store), choice, "best", reason)


def _best_verified(
    store: str, metric: str, mode: str, log: Callable[[str], None]
) -> tuple[Manifest | None, str]:
    """The best committed checkpoint by ``metric`` whose shards verify (of equals the
    earliest), and why; ``None`` and why not when there is none."""
    from tideflow.checkpoint import CheckpointManager

    manager = CheckpointManager(store)
    manifests = manager.committed()
    scored = [
        m
        for m in manifests
        if isinstance(m.metrics.get(metric), (int, float)) and math.isfinite(m.metrics[metric])
    ]
    if not scored:
        return None, (
            f"checkpoint: best, but none of the {len(manifests)} committed checkpoint(s) has "
            f"a finite {metric} (the gang's keep_best metric)"
        )
    sign = -1.0 if mode == "max" else 1.0
    for manifest in sorted(scored, key=lambda m: (sign * float(m.metrics[metric]), m.step)):
        problems = manager.verify(manifest)
        if problems:
            log(
                f"tideflow: checkpoint: best: skipping step {manifest.step} "
                f"({metric} {manifest.metrics[metric]:.4f}): {'; '.join(problems)}"
            )
            continue
        value = float(manifest.metrics[metric])
        return manifest, (
            f"best by {metric} ({mode}): {value:.4f} at step {manifest.step}, of "
            f"{len(scored)} scored checkpoint(s); the newest is step {manifests[-1].step}"
        )
    return None, f"checkpoint: best, but no checkpoint scored by {metric} verifies"
