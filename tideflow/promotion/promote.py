"""One promotion decision, start to finish: gate, registry moves, audit (no Airflow).

Shared by ``PromoteCheckpointOperator`` and the standalone executor Argo runs.
The caller finds the challenger (checkpoint and metrics), the promotion step's
MLflow run and who is acting; this module decides and moves the registry:

* a gate that reads a metric the evaluation did not produce is a misconfigured
  pipeline: ``PromotionError`` (final) before anything is read or written;
* a version already promoted by this step's run is reported again, nothing moves;
* the gate (``tideflow.promotion.gate.decide``) compares with the alias's holder;
* rejected (thresholds, or not better than the champion by more than
  ``min_delta``; a tie never promotes): an audit record, and tags for the step's run;
* passed: the attempt that holds the run's registration claim
  (``tideflow.promotion.claim``; concurrent attempts wait for its version) has
  the builder log an MLflow model from the checkpoint, a version is
  registered once (found again by the run), the alias moves (the old holder
  keeps ``previous-champion``), the checkpoint is copied under ``promoted/`` so
  retention never deletes it, and an audit record is written.

A promotion that cannot go on raises ``PromotionError`` (``final`` when a retry
cannot help); each caller maps it to its runtime's failure, so this package
knows nothing of the steps package or Airflow. Whatever ``build`` raises passes
through unchanged.
"""

from __future__ import annotations

import getpass
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tideflow.promotion import registry
from tideflow.promotion.claim import RegistrationClaim
from tideflow.promotion.gate import GateConfigError, PromotionVerdict, check_gate, decide
from tideflow.storage import open_store

CLAIM_POLL_S = 0.5
# Runs the step's builder entry point with these keyword arguments; returns its outputs.
Build = Callable[[str | list[str], dict[str, Any]], dict[str, Any]]


class PromotionError(Exception):
    """The promotion cannot go on; ``final`` marks failures a retry cannot fix."""

    def __init__(self, message: str, *, final: bool = False) -> None:
        super().__init__(message)
        self.final = final


@dataclass(frozen=True)
class PromotionRequest:
    step: str
    model: str
    alias: str
    gate: dict[str, Any]
    metrics: dict[str, float]
    # The challenger: checkpoint, checkpoint_store, checkpoint_step, checkpoint_checksum
    trained: dict[str, Any]
    run_id: str  # the promotion step's MLflow run: a registered version is found again by it
    who: str
    artifact_root: str
    builder: str | list[str] | None = None
    builder_args: dict[str, Any] = field(default_factory=dict)
    # Tags every registered version carries besides the checkpoint and metrics:
    # tideflow.pipeline, tideflow.dag_id, tideflow.dag_run_id, tideflow.training_task, ...
    lineage: dict[str, str] = field(default_factory=dict)
    # How the evaluation chose the checkpoint it scored (tideflow.checkpoint_choice, ...;
    # tideflow.steps.evaluation.selection_tags): on the promotion's run and the version.
    selection: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PromotionResult:
    outputs: dict[str, Any]
    # Tags for the step's MLflow run; None when a repeat found the work already done.
    run_tags: dict[str, str] | None


def whoami() -> str:
    """The acting user; a container's uid often has no passwd entry, so fall back to it."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


def promote(
    mlflow: Any, request: PromotionRequest, build: Build, log: Callable[[str], None]
) -> PromotionResult:
    _check_request(request)
    registry.ensure_registered_model(mlflow, request.model)
    existing = registry.version_for_run(mlflow, request.model, request.run_id)
    if _promoted(existing):
        return _repeated(request, existing, log)
    current = registry.champion(mlflow, request.model, request.alias)
    decision = decide(request.metrics, request.gate, current[1] if current else None)
    record = _audit_record(request, decision, current)
    if not decision.promote:
        return _rejected(mlflow, request, decision, record, log)
    claim = RegistrationClaim(open_store(request.artifact_root), request.model, request.run_id)
    done = _hold_claim(mlflow, claim, request, log)
    if done is not None:  # a concurrent attempt of this run promoted while we waited
        return _repeated(request, done, log)
    version, previous = _register_and_move_alias(mlflow, request, build, claim, record)
    log(
        f"tideflow: promoted {request.model} version {version.version} to @{request.alias} "
        f"({decision.summary})"
    )
    outputs: dict[str, Any] = {
        "decision": "promoted",
        "version": str(version.version),
        "alias": request.alias,
        "previous": previous,
        "reason": decision.summary,
        "metrics": request.metrics,
        "model_uri": f"models:/{request.model}@{request.alias}",
    }
    tags = _run_tags(
        "promoted", decision, request, {"tideflow.model_version": str(version.version)}
    )
    return PromotionResult(outputs, tags)


def _check_request(request: PromotionRequest) -> None:
    """Refuse, before anything is read or written, a gate on a metric the evaluation did
    not produce (final) and a training step that reported no checkpoint."""
    try:
        check_gate(request.metrics, request.gate)
    except GateConfigError as exc:
        raise PromotionError(
            f"tideflow: step '{request.step}' is misconfigured: {exc}", final=True
        ) from exc
    if not request.trained.get("checkpoint"):
        raise PromotionError("tideflow: the training step reported no checkpoint")


def _audit_record(
    request: PromotionRequest,
    decision: PromotionVerdict,
    current: tuple[Any, dict[str, float]] | None,
) -> dict[str, Any]:
    """The decision's audit record; ``what`` is filled in once it is known."""
    return {
        "who": request.who,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "what": "",
        "why": decision.summary,
        "checkpoint": request.trained["checkpoint"],
        "checkpoint_step": request.trained.get("checkpoint_step"),
        "metrics": request.metrics,
        "champion": None if current is None else str(current[0].version),
    }


def _run_tags(
    outcome: str, decision: PromotionVerdict, request: PromotionRequest, extra: dict[str, str]
) -> dict[str, str]:
    """Tags for the step's MLflow run: the outcome, why, and the challenger's checkpoint."""
    return {
        "tideflow.decision": outcome,
        "tideflow.reason": decision.summary,
        "tideflow.compared": json.dumps(decision.compared, default=str)[:4900],
        **extra,
        **checkpoint_tags(request),
    }


def _rejected(
    mlflow: Any,
    request: PromotionRequest,
    decision: PromotionVerdict,
    record: dict[str, Any],
    log: Callable[[str], None],
) -> PromotionResult:
    log(f"tideflow: not promoted: {decision.summary}")
    registry.audit(mlflow, request.model, {**record, "what": "rejected"})
    outputs: dict[str, Any] = {
        "decision": "rejected",
        "reason": decision.summary,
        "metrics": request.metrics,
    }
    return PromotionResult(outputs, _run_tags("rejected", decision, request, {}))


def _register_and_move_alias(
    mlflow: Any,
    request: PromotionRequest,
    build: Build,
    claim: RegistrationClaim,
    record: dict[str, Any],
) -> tuple[Any, str | None]:
    """Under the held claim: the run's version (registered once), the alias moved to it,
    the checkpoint kept, the audit written; the version and the alias's previous holder."""
    try:
        # a holder before us may have registered and died before moving the alias
        version = registry.version_for_run(mlflow, request.model, request.run_id)
        version = version or _register(mlflow, request, build, claim)
        previous = registry.move_alias(mlflow, request.model, request.alias, str(version.version))
        promoted_copy = copy_promoted(request, str(version.version))
        record.update(
            what=f"promoted version {version.version} to @{request.alias}",
            previous=previous,
            promoted_copy=promoted_copy,
        )
        registry.audit(mlflow, request.model, record)
        # last: waiting attempts return as soon as they see this tag
        mlflow.set_model_version_tag(
            request.model, version.version, "tideflow.decision", "promoted"
        )
    except BaseException:
        claim.release()  # a retry or a waiting attempt takes over now, not after the TTL
        raise
    return version, previous


def checkpoint_tags(request: PromotionRequest) -> dict[str, str]:
    """The challenger's checkpoint, its step and how the evaluation chose it, as tags."""
    trained = request.trained
    step = trained.get("checkpoint_step")
    return {
        "tideflow.checkpoint": str(trained["checkpoint"]),
        **({"tideflow.checkpoint_step": str(step)} if step not in (None, "") else {}),
        **request.selection,
    }


def _promoted(version: Any | None) -> bool:
    return version is not None and version.tags.get("tideflow.decision") == "promoted"


def _repeated(
    request: PromotionRequest, version: Any, log: Callable[[str], None]
) -> PromotionResult:
    log(f"tideflow: version {version.version} was already promoted by this run; nothing to do")
    outputs = {
        "decision": "promoted",
        "version": str(version.version),
        "alias": request.alias,
        "repeated": True,
    }
    return PromotionResult(outputs, None)


def _hold_claim(
    mlflow: Any, claim: RegistrationClaim, request: PromotionRequest, log: Callable[[str], None]
) -> Any | None:
    """Hold the run's registration claim, or return the version a concurrent holder promoted."""
    waited = False
    while not claim.try_acquire():
        found = registry.version_for_run(mlflow, request.model, request.run_id)
        if _promoted(found):
            return found
        if not waited:
            log(
                f"tideflow: another attempt of this promotion holds its claim "
                f"({claim.describe_holder()}); waiting for its version"
            )
            waited = True
        time.sleep(CLAIM_POLL_S)
    return None


def _register(
    mlflow: Any, request: PromotionRequest, build: Build, claim: RegistrationClaim
) -> Any:
    if request.builder is None:
        raise PromotionError(
            f"tideflow: step '{request.step}' has no builder to "
            "turn the checkpoint into an MLflow model",
            final=True,
        )
    trained = request.trained
    args: dict[str, Any] = {
        **request.builder_args,
        "run_id": request.run_id,
        **{
            k: trained[k]
            for k in ("checkpoint", "checkpoint_store", "checkpoint_step")
            if k in trained
        },
    }
    built = build(request.builder, args)
    if "model_uri" not in built:
        raise PromotionError("tideflow: the builder did not return a model_uri")
    tags = {
        **request.lineage,
        "tideflow.promotion_run": request.run_id,
        **checkpoint_tags(request),
        "tideflow.checkpoint_checksum": str(trained.get("checkpoint_checksum", "")),
        **{f"{registry.METRIC_TAG}{k}": str(v) for k, v in request.metrics.items()},
    }
    if not claim.still_held():  # stalled past the claim's TTL: another attempt took over
        raise PromotionError(
            f"tideflow: this promotion attempt lost its claim to {claim.describe_holder()} "
            "while building the model; it registers nothing (a retry finds the version)"
        )
    return registry.register(mlflow, request.model, str(built["model_uri"]), request.run_id, tags)


def copy_promoted(request: PromotionRequest, version: str) -> str | None:
    """Keep the promoted checkpoint under promoted/ so retention never deletes it."""
    from tideflow.checkpoint import CheckpointManager

    trained = request.trained
    store = trained.get("checkpoint_store")
    step = trained.get("checkpoint_step")
    if not store or step is None:
        return None
    source = CheckpointManager(str(store))
    manifest = next((m for m in source.committed() if m.step == int(step)), None)
    if manifest is None:
        return None
    target = CheckpointManager(f"{request.artifact_root}/promoted/{request.model}/v{version}")
    shards = {r.name: source.read_shard(manifest, r.name) for r in manifest.shards}
    copied = target.save(
        manifest.step,
        shards,
        manifest.metrics,
        {**manifest.meta, "source": manifest.uri, "source_sha256": manifest.checksum},
    )
    return copied.uri
