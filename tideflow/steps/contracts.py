"""What tideflow passes to an evaluation entry point and to a promotion builder.

Both are ``module:function`` entry points called as ``function(ctx, **arguments)``:

``ctx``
    a :class:`~tideflow.steps.context.StepContext` (pipeline, team, step, run id,
    try number, artifact root, the run's params).
``arguments``
    the trained checkpoint (:class:`EvaluationArguments`), then the step's own
    ``args`` from the YAML (a key the step sets wins). A builder also gets
    ``run_id`` (:class:`BuilderArguments`).

An evaluation returns ``{metric: number}`` with at least the step's declared
``metrics``; a builder logs an MLflow model into ``run_id`` and returns
``{"model_uri": ...}``. :class:`TrainedCheckpoint` reads the checkpoint those
arguments name, verified, in the format ``tideflow.checkpoints()`` writes.
"""

from __future__ import annotations

import inspect
import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from tideflow.checkpoint import CheckpointError, CheckpointManager, Manifest
from tideflow.checkpoint.manifest import MODEL_SHARD


class EvaluationArguments(TypedDict):
    """The keyword arguments naming the checkpoint an evaluation scores."""

    checkpoint: str  # the checkpoint's manifest URI: ``<store>/step-N/MANIFEST.json``
    checkpoint_store: str  # the training gang's store (file:// or s3://)
    checkpoint_step: int  # the step of the committed checkpoint to evaluate


class BuilderArguments(EvaluationArguments):
    """A promotion builder's: the checkpoint, and the MLflow run to log the model into."""

    run_id: str


CONTRACT_KEYS: dict[str, tuple[str, ...]] = {
    "evaluation": tuple(EvaluationArguments.__annotations__),
    "builder": tuple(BuilderArguments.__annotations__),
}


def signature_problem(function: Callable[..., Any], role: str, step_args: Mapping[str, Any]) -> str:
    """Why ``function`` cannot be called as a ``role`` ("evaluation" or "builder"), or ``""``.

    It must take the context positionally, every contract key and every key
    of the step's ``args`` by keyword (or ``**kwargs``), and require nothing else.
    """
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):  # a builtin or C function: nothing to check
        return ""
    positional = [
        p
        for p in parameters
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        and p.name not in (*CONTRACT_KEYS[role], *step_args)
    ]
    if not positional and not any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return "it takes no positional parameter for the step context (ctx)"
    by_name = {p.name: p for p in parameters[1:] if p.kind is not p.VAR_POSITIONAL}
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters)
    given = {*CONTRACT_KEYS[role], *step_args}
    refused = sorted(
        key
        for key in given
        if not takes_any
        and (key not in by_name or by_name[key].kind is inspect.Parameter.POSITIONAL_ONLY)
    )
    if refused:
        return (
            f"it does not accept keyword argument(s) {refused}; tideflow passes "
            f"{sorted(given)} (add them, or **kwargs)"
        )
    required = sorted(
        name
        for name, p in by_name.items()
        if p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and name not in given
        and p is not positional[0]
    )
    if required:
        return f"it requires {required}, which neither tideflow nor the step's args give"
    return ""


@dataclass(frozen=True)
class TrainedCheckpoint:
    """The checkpoint an evaluation or a builder is given, read back verified."""

    store: str
    step: int
    uri: str = ""

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any]) -> TrainedCheckpoint:
        """From an entry point's keyword arguments (``checkpoint_store``, ``checkpoint_step``)."""
        missing = [k for k in ("checkpoint_store", "checkpoint_step") if k not in arguments]
        if missing:
            raise CheckpointError(f"the arguments name no checkpoint: {missing} missing")
        return cls(
            str(arguments["checkpoint_store"]),
            int(arguments["checkpoint_step"]),
            str(arguments.get("checkpoint", "")),
        )

    def manifest(self) -> Manifest:
        """The committed manifest, every shard verified against its SHA-256."""
        return CheckpointManager(self.store).load(self.step)

    def state(self) -> dict[str, Any]:
        """The state ``tideflow.checkpoints()`` saved: ``{name: state_dict, ...}``.

        Keyed by the names given to ``tideflow.checkpoints(model=..., ...)``; a
        DDP or compiled model's weights are saved unwrapped (no ``module.``).
        """
        import torch

        manager = CheckpointManager(self.store)
        manifest = manager.load(self.step)
        data = manager.read_shard(manifest, MODEL_SHARD)
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        return state  # type: ignore[no-any-return]
