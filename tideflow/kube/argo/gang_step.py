"""A gang_training step: a container running tideflow's gang driver, which owns the gang.

The driver (``python -m tideflow.gangs.driver``) gets the step as the standalone
executor does (``--config`` and one ``--set`` per value the workflow fills in,
so a gang's size may be a workflow parameter), resolves it as the operator does
and submits it through the Kubernetes backend. So on Argo the gang's object is
named from its id, capped per target, and exists at most once:

* the step's ``activeDeadlineSeconds`` is the driver pod's (Argo sets it on the
  pod; argo docs/fields.md, Template.activeDeadlineSeconds), so when it passes,
  or on ``argo stop``, the driver gets SIGTERM and deletes the gang before it
  exits; a resource template would have left the Volcano Job running;
* a retried step is a new driver pod with the same gang id: it follows the gang
  if it still runs and replaces it if it failed, never starting a second;
* a preempted gang is submitted again with the restarts it has left.

The gang carries the class the Airflow operator would give it: the run's, when
the pipeline names one (the workflow then has a ``priority_class`` parameter,
as the DAG has a param, and the driver gets it as ``--set priority_class``),
else its team's default, both checked against the cluster file the workflow was
compiled with (``--team-classes``, ``tideflow.kube.argo.team_classes``).

The driver is the one step container with an API token: its template runs as
``argo_gang_driver_service_account`` (deploy/kubernetes/argo-rbac.yaml). Its
outputs (``GANG_OUTPUTS``) tell the steps after it where the checkpoints are.
A gang needs a command entry point, as on the Kubernetes backend.
"""

from __future__ import annotations

from dataclasses import dataclass

from tideflow.compile.dag_plan import TaskPlan
from tideflow.compile.gang_plan import gang_plan_to_json
from tideflow.compile.templates import exact_param
from tideflow.kube.argo.container import container_step, executor_args
from tideflow.kube.argo.context import CompileContext
from tideflow.kube.argo.plan import WORKFLOW_NAME, WORKFLOW_UID, StepTemplate
from tideflow.kube.argo.team_classes import team_classes_json
from tideflow.kube.settings import settings_to_json
from tideflow.spec.yamlpos import Path
from tideflow.steps.standalone_io import GANG_OUTPUTS

DRIVER = ("python", "-m", "tideflow.gangs.driver")
# The driver only talks to the API server and reads one checkpoint manifest.
DRIVER_CPU, DRIVER_MEMORY = "100m", "512Mi"


@dataclass(frozen=True)
class Sized:
    """A size of the gang: its default, and the workflow parameter that sets it, if one does."""

    default: int
    expression: str | None  # the workflow parameter that sets it, when templated


def sized(ctx: CompileContext, value: int | str, path: Path) -> Sized:
    """A gang size: an integer, or exactly one int param (Argo fills the number in)."""
    if isinstance(value, int):
        return Sized(value, None)
    name = exact_param(value)
    spec = ctx.spec.params.get(name or "")
    if spec is not None and spec.type == "int":
        return Sized(int(spec.default), f"{{{{workflow.parameters.{name}}}}}")
    ctx.issue(
        path,
        f"'{value}' cannot size a gang object",
        "an integer, or '{{ params.NAME }}' of an int param",
    )
    return Sized(1, None)


def gang_step(ctx: CompileContext, index: int, task: TaskPlan) -> StepTemplate | None:
    plan = task.gang
    assert plan is not None  # a gang_training task's
    base: Path = ("steps", index, "gang_training")
    entrypoint = plan.entrypoint
    if isinstance(entrypoint, str):
        ctx.issue(
            (*base, "entrypoint"),
            f"entry point '{entrypoint}' is module:function; a gang on Kubernetes runs "
            "a command in each worker",
            "a command as a list, such as [python, -m, my.train, --lr, '{{ params.lr }}']",
        )
        return None
    sizes = {
        "workers": plan.workers,
        "devices_per_worker": plan.devices_per_worker,
        "max_restarts": plan.max_restarts,
    }
    for size, value in sizes.items():
        sized(ctx, value, (*base, size))
    inputs: dict[str, str] = {}
    extra = [
        "--kube-settings",
        settings_to_json(ctx.settings),
        # The workflow owns the gang: deleting the workflow deletes it, even after
        # a driver that was killed without its grace.
        "--owner-name",
        WORKFLOW_NAME,
        "--owner-uid",
        WORKFLOW_UID,
    ]
    team_classes = team_classes_json(ctx.inventory, ctx.plan.team)
    if team_classes is not None:
        extra += ["--team-classes", team_classes]
    # The step's plan, with the image its workers run in, the pipeline's code in it and
    # the run's class (the workflow parameter, as the DAG's param); the driver itself is
    # tideflow's and runs in the platform's image.
    args = executor_args(ctx, task, gang_plan_to_json(plan), base, inputs, extra=extra)
    return container_step(
        ctx,
        task,
        inputs,
        args,
        where="cpu",
        env={},
        requests={"cpu": DRIVER_CPU, "memory": DRIVER_MEMORY},
        limits={"memory": DRIVER_MEMORY},
        outputs=GANG_OUTPUTS,
        command=DRIVER,
        service_account=ctx.settings.argo_gang_driver_service_account,
        reports_to_mlflow=False,  # its gang's workers do; the driver never calls MLflow
    )
