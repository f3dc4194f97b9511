"""What every container step shares: the standalone executor's command line, and its template.

The container runs ``python -m tideflow.steps.standalone`` in the platform
image, which calls the step's entry point as the operators do and writes each
output to a file under ``OUTPUTS_DIR`` for Argo to read.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tideflow.compile.dag_plan import TaskPlan
from tideflow.kube.argo.context import CompileContext
from tideflow.kube.argo.parameters import value_type
from tideflow.kube.argo.plan import OUTPUTS_DIR, RETRY_NUMBER, WORKFLOW_NAME, StepTemplate
from tideflow.kube.argo.templating import split
from tideflow.kube.pods import (
    MLFLOW_CLIENT_LABELS,
    placement,
    restricted,
    restricted_pod,
    store_env,
    store_env_from,
)
from tideflow.spec.yamlpos import Path

EXECUTOR = ("python", "-m", "tideflow.steps.standalone")
# Evaluation and promotion pods: one core, and room for torch and the model.
STEP_CPU, STEP_MEMORY = "1", "2Gi"


def executor_args(
    ctx: CompileContext,
    task: TaskPlan,
    doc: dict[str, Any],
    base: Path,
    inputs: dict[str, str],
    *,
    extra: Sequence[str] = (),
) -> list[str]:
    """The executor's arguments: the step, its config ``doc``, every param, then ``extra``."""
    static, sets = split(ctx, doc, base, task, inputs)
    args = [
        task.kind,
        "--pipeline",
        ctx.plan.dag_id,
        "--team",
        ctx.plan.team,
        "--step",
        task.task_id,
        "--run-id",
        WORKFLOW_NAME,
    ]
    if task.retries:  # {{retries}} exists only in templates with a retry strategy
        args += ["--attempt", RETRY_NUMBER]
    args += ["--config", json.dumps(static, sort_keys=True, separators=(",", ":")), *sets]
    for name, spec in ctx.spec.params.items():
        args += ["--param", f"{name}:{value_type(spec)}={{{{workflow.parameters.{name}}}}}"]
    return [*args, *extra, "--outputs", OUTPUTS_DIR]


def container_step(
    ctx: CompileContext,
    task: TaskPlan,
    inputs: dict[str, str],
    args: list[str],
    *,
    where: str,
    env: dict[str, str],
    requests: dict[str, str],
    limits: dict[str, str],
    outputs: tuple[str, ...],
    command: Sequence[str] = EXECUTOR,
    service_account: str | None = None,
    reports_to_mlflow: bool = True,
    image: str | None = None,
) -> StepTemplate:
    """The executor's container (or ``command``'s), placed on ``where`` (a device or pool
    class) and restricted; with a token of ``service_account`` only where one is named.
    ``image``: the step's (None: the platform's, ``KubeSettings.image``)."""
    place = placement(where, ctx.settings)
    container: dict[str, Any] = {
        "image": image or ctx.settings.image,
        "command": list(command),
        "args": args,
        "env": [
            *store_env(ctx.settings),
            # The image's home may not be writable by the restricted user.
            {"name": "TIDEFLOW_HOME", "value": "/tmp/tideflow"},
            *({"name": k, "value": v} for k, v in env.items()),
        ],
        "resources": {"requests": requests, "limits": limits},
        "securityContext": restricted(),
    }
    env_from = store_env_from(ctx.settings)
    if env_from:
        container["envFrom"] = env_from
    return StepTemplate(
        name=task.task_id,
        kind=task.kind,
        dependencies=task.upstream,
        arguments=dict(sorted(inputs.items())),
        outputs=outputs,
        retries=task.retries,
        timeout_seconds=task.timeout_seconds,
        # A step that reports to MLflow is labelled so: MLflow's NetworkPolicy admits those.
        labels={**ctx.labels(task), **(MLFLOW_CLIENT_LABELS if reports_to_mlflow else {})},
        pod=place.apply({"securityContext": restricted_pod()}),
        container=container,
        service_account=service_account,
    )
