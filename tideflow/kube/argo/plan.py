"""The compiled workflow as plain data: what ``tideflow.argo`` maps onto hera, one to one.

Also the names Argo resolves while the workflow runs (its name, the retry
number) and the places and conditions both sides must agree on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Each container step writes its outputs here; Argo reads each file as an output parameter.
OUTPUTS_DIR = "/tmp/tideflow/outputs"
WORKFLOW_NAME = "{{workflow.name}}"
WORKFLOW_UID = "{{workflow.uid}}"
RETRY_NUMBER = "{{retries}}"


@dataclass(frozen=True)
class WorkflowParam:
    name: str
    value: str
    description: str = ""
    enum: tuple[str, ...] | None = None


@dataclass(frozen=True)
class StepTemplate:
    """One step: its DAG task (dependencies, arguments) and its template (what runs)."""

    name: str
    kind: str
    dependencies: tuple[str, ...]
    arguments: dict[str, str]  # input parameter -> the upstream output the task passes in
    outputs: tuple[str, ...]  # output parameters, each read from OUTPUTS_DIR/<name>
    retries: int
    timeout_seconds: int | None
    labels: dict[str, str]
    pod: dict[str, Any]  # securityContext, nodeSelector, affinity, tolerations, priorityClassName
    container: dict[str, Any]
    # The one step that calls the Kubernetes API (the gang driver) runs as this
    # ServiceAccount with its token mounted; every other step has none.
    service_account: str | None = None


@dataclass(frozen=True)
class WorkflowPlan:
    name: str
    namespace: str
    labels: dict[str, str]
    annotations: dict[str, str]
    entrypoint: str  # the DAG template's name
    params: tuple[WorkflowParam, ...]
    steps: tuple[StepTemplate, ...] = field(default=())
    on_exit: StepTemplate | None = None  # runs once the DAG has ended, however it ended
    schedule: str | None = None  # a CronWorkflow submits the template on it (Argo's cron form)
    # Every pod runs as service_account with no token mounted; Argo mounts the
    # executor's token into its own containers only (they report outputs), so the
    # steps' containers get no API access, except a step with a service_account.
    service_account: str = "default"
    executor_service_account: str | None = None
