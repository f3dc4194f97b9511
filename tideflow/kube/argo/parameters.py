"""Workflow parameters: which names Argo accepts, their text, and how the executor types them."""

from __future__ import annotations

import json
import re
from typing import Any

from tideflow.compile.dag_plan import DagPlan
from tideflow.kube.argo.plan import WorkflowParam
from tideflow.spec.models import ParamSpec, PipelineSpec
from tideflow.spec.params import PRIORITY_PARAM

# Argo refuses other characters in parameter names.
ARGO_NAME = re.compile(r"^[-a-zA-Z0-9_]+$")
ARGO_NAME_ACCEPTED = "letters, digits, '-' and '_' (Argo parameter names)"

# How the standalone executor reads a value Argo filled in (see tideflow.steps.standalone).
VALUE_TYPES = {"string": "str", "int": "int", "float": "float", "bool": "bool"}


def param_text(value: Any) -> str:
    """A value as Argo parameter text; booleans as JSON spells them."""
    return json.dumps(value) if isinstance(value, bool) else str(value)


def value_type(spec: ParamSpec) -> str:
    if spec.type == "enum":
        return "str" if all(isinstance(v, str) for v in spec.values or ()) else "json"
    return VALUE_TYPES[spec.type]


def workflow_params(spec: PipelineSpec, plan: DagPlan) -> tuple[WorkflowParam, ...]:
    """The pipeline's params as the WorkflowTemplate's parameters, defaults and choices as
    text; then the run's priority class where the DAG has that param (``PRIORITY_PARAM``)."""
    own = tuple(
        WorkflowParam(
            name,
            param_text(param.default),
            param.description,
            tuple(param_text(v) for v in param.values) if param.values is not None else None,
        )
        for name, param in spec.params.items()
    )
    chosen = plan.params.get(PRIORITY_PARAM)
    if chosen is None or PRIORITY_PARAM in spec.params:
        return own
    return (*own, WorkflowParam(PRIORITY_PARAM, str(chosen.default), chosen.description, None))
