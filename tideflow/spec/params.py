"""Parse ``--param name=value`` pairs against a pipeline's declared params."""

from __future__ import annotations

import json
import math
from typing import Any

from tideflow.spec.models import ParamSpec, PipelineSpec
from tideflow.spec.report import did_you_mean


class ParamValueError(ValueError):
    """A run parameter given on the command line is unknown or has a bad value."""


PRIORITY_PARAM = "priority_class"

_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}


def _coerce(name: str, spec: ParamSpec, text: str) -> Any:
    try:
        if spec.type == "int":
            value: Any = int(text)
        elif spec.type == "float":
            value = float(text)
        elif spec.type == "bool":
            if text.lower() not in _TRUE | _FALSE:
                raise ValueError
            value = text.lower() in _TRUE
        elif spec.type == "enum":
            choices = {str(v): v for v in spec.values or ()}
            if text not in choices:
                raise ParamValueError(
                    f"param '{name}': {text!r} is not accepted; one of {sorted(choices)}"
                )
            value = choices[text]
        else:
            value = text
    except ValueError as exc:
        if isinstance(exc, ParamValueError):
            raise
        raise ParamValueError(f"param '{name}': {text!r} is not a valid {spec.type}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ParamValueError(
            f"param '{name}': {text!r} is not a finite number; a float such as 0.5 or 1e-3"
        )
    if spec.minimum is not None and value < spec.minimum:
        raise ParamValueError(f"param '{name}': {value} is below its minimum {spec.minimum}")
    if spec.maximum is not None and value > spec.maximum:
        raise ParamValueError(f"param '{name}': {value} is above its maximum {spec.maximum}")
    return value


def run_params(spec: PipelineSpec) -> dict[str, ParamSpec]:
    """The params a run may set: the pipeline's own, then ``priority_class`` when the
    pipeline names a priority class, defaulting to it.

    The one list of them: the DAG's params (``compile_dag_plan``) and ``tideflow run
    --param`` both come from here, so the CLI accepts what the trigger form offers.
    """
    named = spec.metadata.priority_class
    if named is None or PRIORITY_PARAM in spec.params:
        return dict(spec.params)
    chosen = ParamSpec(
        type="string",
        default=named,
        description="Priority class of this run's gangs: one the cluster file lets "
        "the team use (checked when a gang asks for devices).",
    )
    return {**spec.params, PRIORITY_PARAM: chosen}


def parse_param_overrides(spec: PipelineSpec, pairs: list[str]) -> dict[str, Any]:
    """``["lr=0.1", "epochs=3"]`` -> ``{"lr": 0.1, "epochs": 3}``, typed and bounds-checked."""
    accepted = run_params(spec)
    values: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep:
            raise ParamValueError(f"--param {pair!r}: expected NAME=VALUE")
        if name not in accepted:
            hint = did_you_mean(name, accepted)
            known = ", ".join(accepted) or "none"
            raise ParamValueError(f"unknown param '{name}'; {hint}declared params: {known}")
        values[name] = _coerce(name, accepted[name], text)
    return values


def literal(value: Any) -> str:
    """A value as the pipeline file would spell it: 2, 0.05, "adam", true, null."""
    return json.dumps(value, default=str)


def param_summary(param: ParamSpec) -> str:
    """A param as ``tideflow plan`` lists it: ``float = 0.001, minimum 1e-06``."""

    def number(value: float) -> str:
        return str(int(value)) if param.type == "int" and value.is_integer() else str(value)

    text = f"{param.type} = {literal(param.default)}"
    if param.minimum is not None:
        text += f", minimum {number(param.minimum)}"
    if param.maximum is not None:
        text += f", maximum {number(param.maximum)}"
    if param.values is not None:
        text += ", one of " + ", ".join(literal(value) for value in param.values)
    return text
