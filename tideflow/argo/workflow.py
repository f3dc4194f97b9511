"""A compiled ``WorkflowPlan`` as hera objects, and the WorkflowTemplate file they emit.

Every decision (which steps, their dependencies, pods, commands, identities)
is in the plan; this module maps it onto hera's classes one to one, so hera
checks the shapes against Argo's generated model and writes the YAML.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hera.workflows import (
    DAG,
    Container,
    CronWorkflow,
    Parameter,
    RetryStrategy,
    Task,
    WorkflowTemplate,
)
from hera.workflows import models as m

from tideflow.inventory import Inventory
from tideflow.kube.argo import compile_workflow
from tideflow.kube.argo.plan import OUTPUTS_DIR, StepTemplate, WorkflowPlan
from tideflow.kube.settings import KubeSettings
from tideflow.spec.loader import display_path, load_pipeline
from tideflow.spec.yamlpos import load_yaml

SUFFIX = ".workflowtemplate.yaml"
CRON_SUFFIX = ".cronworkflow.yaml"


def _container(step: StepTemplate) -> Container:
    pod, spec = step.pod, step.container
    return Container(
        name=step.name,
        labels=step.labels,
        inputs=[Parameter(name=name) for name in step.arguments] or None,
        # Airflow retries a task whatever failed it; "Always" retries errors too.
        retry_strategy=(
            RetryStrategy(limit=step.retries, retry_policy="Always") if step.retries else None
        ),
        # Argo sets it on the step's pod: when it passes, the kubelet stops the pod
        # (SIGTERM, then SIGKILL after the grace period).
        active_deadline_seconds=step.timeout_seconds,
        node_selector=pod.get("nodeSelector"),
        affinity=m.Affinity.model_validate(pod["affinity"]) if "affinity" in pod else None,
        tolerations=[m.Toleration.model_validate(t) for t in pod.get("tolerations", [])] or None,
        priority_class_name=pod.get("priorityClassName"),
        pod_security_context=m.PodSecurityContext.model_validate(pod["securityContext"]),
        service_account_name=step.service_account,
        # The one step that calls the API server gets its own account's token.
        automount_service_account_token=True if step.service_account else None,
        image=spec["image"],
        command=spec["command"],
        args=spec["args"],
        env=[m.EnvVar.model_validate(variable) for variable in spec["env"]],
        env_from=[m.EnvFromSource.model_validate(source) for source in spec.get("envFrom", [])]
        or None,
        resources=m.ResourceRequirements.model_validate(spec["resources"]),
        security_context=m.SecurityContext.model_validate(spec["securityContext"]),
        outputs=[
            Parameter(name=name, value_from=m.ValueFrom(path=f"{OUTPUTS_DIR}/{name}"))
            for name in step.outputs
        ]
        or None,
    )


def workflow_template(plan: WorkflowPlan) -> WorkflowTemplate:
    dag = DAG(
        name=plan.entrypoint,
        tasks=[
            Task(
                name=step.name,
                template=step.name,
                dependencies=list(step.dependencies) or None,
                arguments=[Parameter(name=k, value=v) for k, v in step.arguments.items()] or None,
            )
            for step in plan.steps
        ],
    )
    templates: list[Any] = [dag]
    for step in plan.steps:
        templates.append(_container(step))
    if plan.on_exit is not None:
        templates.append(_container(plan.on_exit))
    executor = plan.executor_service_account
    return WorkflowTemplate(
        name=plan.name,
        namespace=plan.namespace,
        labels=plan.labels,
        annotations=plan.annotations or None,
        entrypoint=plan.entrypoint,
        on_exit=plan.on_exit.name if plan.on_exit is not None else None,
        service_account_name=plan.service_account,
        # Step containers get no token; Argo mounts the executor's into its own
        # containers (which Argo requires when automount is off).
        automount_service_account_token=False if executor else None,
        executor=m.ExecutorConfig(service_account_name=executor) if executor else None,
        arguments=[
            Parameter(
                name=param.name,
                value=param.value,
                description=param.description or None,
                enum=list(param.enum) if param.enum is not None else None,
            )
            for param in plan.params
        ],
        templates=templates,
    )


def cron_workflow(plan: WorkflowPlan) -> CronWorkflow | None:
    """For a scheduled pipeline: a CronWorkflow that submits its WorkflowTemplate.

    In UTC, as Airflow schedules by default; runs may overlap, as Airflow's
    DAG runs may; a run missed by more than five minutes (the controller was
    down) is skipped, as Airflow does without catchup.
    """
    if plan.schedule is None:
        return None
    return CronWorkflow(
        name=plan.name,
        namespace=plan.namespace,
        labels=plan.labels,
        schedules=[plan.schedule],
        timezone="UTC",
        concurrency_policy="Allow",
        starting_deadline_seconds=300,
        workflow_template_ref=m.WorkflowTemplateRef(name=plan.name),
    )


def _header(source: str) -> str:
    return (
        f"# Generated by 'tideflow compile --target argo' from {Path(source).name}.\n"
        "# Edit the pipeline and compile again; changes made here are lost.\n"
    )


def render(plan: WorkflowPlan, source: str) -> str:
    """The WorkflowTemplate as YAML, with a note of where it came from."""
    return _header(source) + workflow_template(plan).to_yaml()


def render_cron(plan: WorkflowPlan, source: str) -> str | None:
    """The CronWorkflow as YAML, or None for a pipeline without a schedule."""
    cron = cron_workflow(plan)
    return None if cron is None else _header(source) + cron.to_yaml()


def compile_pipeline(
    path: str | Path, *, settings: KubeSettings, inventory: Inventory | None = None
) -> tuple[WorkflowPlan, str]:
    """Load, validate and compile a pipeline file; errors name the file and field positions."""
    spec = load_pipeline(path, inventory)
    shown = display_path(Path(path))
    positions = load_yaml(Path(path).read_text(encoding="utf-8"), shown).positions
    plan = compile_workflow(
        spec, settings=settings, inventory=inventory, file=shown, positions=positions
    )
    return plan, render(plan, str(path))


def write(
    path: str | Path,
    out_dir: str | Path,
    *,
    settings: KubeSettings,
    inventory: Inventory | None = None,
) -> list[Path]:
    """Compile ``path`` into OUT_DIR/<pipeline>.workflowtemplate.yaml (and, for a
    scheduled pipeline, OUT_DIR/<pipeline>.cronworkflow.yaml); return the files."""
    plan, text = compile_pipeline(path, settings=settings, inventory=inventory)
    files = {f"{plan.name}{SUFFIX}": text}
    cron = render_cron(plan, str(path))
    if cron is not None:
        files[f"{plan.name}{CRON_SUFFIX}"] = cron
    written = []
    for name, content in files.items():
        target = Path(out_dir) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        written.append(target)
    return written
