"""A pipeline as an Argo WorkflowTemplate, as plain data (pure; ``tideflow.argo`` builds it).

One DAG template runs one task per step, with the Airflow DAG's dependencies
(both come from the same ``DagPlan``). Each step is a template of its own:

* data_prep, evaluation, promote_checkpoint: a container running the
  standalone executor (``python -m tideflow.steps.standalone``) in the platform
  image. It calls the step's entry point as the operators do and writes each
  output to a file under ``OUTPUTS_DIR``, which Argo reads as an output parameter.
* gang_training: a ``resource`` template that creates the step's Volcano Job
  (owned by the workflow, so deleting the workflow deletes the gang) and waits
  for Volcano's verdict on the whole gang. Argo substitutes ``{{...}}`` in the
  manifest text before it creates the object, so the gang's size may be a
  workflow parameter; integer fields are written unquoted for that reason.

Every pod of the workflow runs as ``argo_service_account`` with no API token
mounted; Argo's own executor containers (they report outputs and create the
gang) get the token of ``argo_executor_service_account``. Steps that report to
MLflow carry the label its NetworkPolicy admits; the resource step does not.

Templates in the pipeline become Argo's (``tideflow.compile.templates``): a
param is a workflow parameter; an upstream output is an input parameter that
the DAG task fills from that task's output parameter. The gang's checkpoint
store is derived from the workflow's name and the step, so evaluation and
promotion find the newest committed checkpoint there; nothing has to come out
of the Volcano Job.

Known limits, refused or documented rather than compiled wrongly: an
evaluation runs on one device kind (the first of its preferences the cluster
inventory has, or the first), not on whichever is free when it starts; a gang
step needs a command entry point, as on the Kubernetes backend; a pipeline's
schedule is not part of the template (a CronWorkflow can submit it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import yaml

from tideflow.compile.dag_plan import POOL_FOR_CLASS, DagPlan, TaskPlan, compile_dag_plan
from tideflow.compile.templates import (
    OutputRef,
    ParamRef,
    Reference,
    TemplateError,
    exact_param,
    has_template,
    rewrite,
)
from tideflow.gangs import checkpoint_env
from tideflow.inventory import Inventory
from tideflow.kube.names import dns_label
from tideflow.kube.pods import (
    DEVICE_RESOURCES,
    MLFLOW_CLIENT_LABELS,
    evaluation_device,
    placement,
    restricted,
    restricted_pod,
    store_env,
    store_env_from,
)
from tideflow.kube.volcano import GangShape, KubeSettings, gang_volcano_job
from tideflow.spec.errors import SpecError, SpecIssue
from tideflow.spec.models import ParamSpec, PipelineSpec
from tideflow.spec.yamlpos import Path, Positions, format_path
from tideflow.steps.standalone import EVALUATION_OUTPUTS, PROMOTION_OUTPUTS
from tideflow.storage import safe_segment

OUTPUTS_DIR = "/tmp/tideflow/outputs"
WORKFLOW_NAME = "{{workflow.name}}"
RETRY_NUMBER = "{{retries}}"
EXECUTOR = ("python", "-m", "tideflow.steps.standalone")
SUCCESS = "status.state.phase == Completed"
FAILURE = "status.state.phase in (Failed,Terminated,Aborted)"
# Evaluation and promotion pods: one core, and room for torch and the model.
STEP_CPU, STEP_MEMORY = "1", "2Gi"
# Argo refuses other characters in parameter names.
ARGO_NAME = re.compile(r"^[-a-zA-Z0-9_]+$")
ARGO_NAME_ACCEPTED = "letters, digits, '-' and '_' (Argo parameter names)"
# Airflow's schedule presets in Argo's cron (robfig/cron): most are the same descriptor;
# "@quarterly" is not one. "@once" and "@continuous" have no CronWorkflow form.
ARGO_SCHEDULES = {
    "@hourly": "@hourly",
    "@daily": "@daily",
    "@weekly": "@weekly",
    "@monthly": "@monthly",
    "@quarterly": "0 0 1 */3 *",
    "@yearly": "@yearly",
}

# How the standalone executor reads a value Argo filled in (see tideflow.steps.standalone).
VALUE_TYPES = {"string": "str", "int": "int", "float": "float", "bool": "bool"}


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
    container: dict[str, Any] | None = None
    manifest: str | None = None
    success_condition: str | None = None
    failure_condition: str | None = None


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
    # executor's token into its own containers only (they report outputs and create
    # the gang), so the steps' containers get no API access.
    service_account: str = "default"
    executor_service_account: str | None = None


@dataclass(frozen=True)
class ArgoInt:
    """An integer field of a manifest that Argo fills in: written unquoted, so it stays a number."""

    expression: str


@dataclass(frozen=True)
class _Sized:
    default: int
    expression: str | None  # the workflow parameter that sets it, when templated


class _RefusedError(Exception):
    def __init__(self, problem: str, accepted: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.accepted = accepted


def param_text(value: Any) -> str:
    """A value as Argo parameter text; booleans as JSON spells them."""
    return json.dumps(value) if isinstance(value, bool) else str(value)


def value_type(spec: ParamSpec) -> str:
    if spec.type == "enum":
        return "str" if all(isinstance(v, str) for v in spec.values or ()) else "json"
    return VALUE_TYPES[spec.type]


def checkpoint_store(settings: KubeSettings, pipeline: str, step: str) -> str:
    """A gang's default checkpoint store in a workflow run: PIPELINE/WORKFLOW/STEP/checkpoints.

    The same layout as a step's artifacts (``StepContext.run_prefix``) with the
    workflow's name as the run id, so a retried gang resumes from its own
    checkpoints and evaluation finds them again.
    """
    return (
        f"{settings.artifact_root}/{safe_segment(pipeline)}/{WORKFLOW_NAME}/"
        f"{safe_segment(step)}/checkpoints"
    )


def manifest_yaml(obj: dict[str, Any]) -> str:
    """YAML for a resource template: ``{{...}}`` strings quoted, ``ArgoInt`` fields bare.

    Quoting keeps a filled-in string a string (``'2'``) and stops a value with
    ``: `` from changing the document's shape; a bare ``{{...}}`` becomes a number.
    """
    tokens: dict[str, str] = {}

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        style = "'" if "{{" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    def integer(dumper: yaml.SafeDumper, value: ArgoInt) -> yaml.ScalarNode:
        token = f"tideflow-argo-int-{len(tokens)}"
        tokens[token] = value.expression
        return dumper.represent_scalar("tag:yaml.org,2002:str", token)

    Dumper.add_representer(str, text)
    Dumper.add_representer(ArgoInt, integer)
    dumped = yaml.dump(obj, Dumper=Dumper, sort_keys=True)
    for token, expression in tokens.items():
        dumped = dumped.replace(token, expression)
    return dumped


class _Compiler:
    def __init__(
        self,
        spec: PipelineSpec,
        settings: KubeSettings,
        inventory: Inventory | None,
        file: str,
        positions: Positions,
    ) -> None:
        self.spec = spec
        self.plan: DagPlan = compile_dag_plan(spec)
        self.tasks = {task.task_id: task for task in self.plan.tasks}
        self.settings = settings
        self.inventory = inventory
        self.file = file
        self.positions = positions
        self.issues: list[SpecIssue] = []

    # -- errors ----------------------------------------------------------------------------
    def issue(self, path: Path, problem: str, accepted: str) -> None:
        line, column = self.positions.of_value(path)
        self.issues.append(SpecIssue(self.file, line, column, format_path(path), problem, accepted))

    # -- the graph -------------------------------------------------------------------------
    def ancestors(self, task: TaskPlan) -> set[str]:
        found: set[str] = set()
        frontier = list(task.upstream)
        while frontier:
            name = frontier.pop()
            if name not in found:
                found.add(name)
                frontier.extend(self.tasks[name].upstream)
        return found

    def outputs_of(self, task: TaskPlan) -> tuple[str, ...]:
        if task.kind == "data_prep":
            return tuple(task.config["outputs"])
        if task.kind == "evaluation":
            metrics = [m for m in task.config["metrics"] if ARGO_NAME.match(m)]
            return tuple(dict.fromkeys((*EVALUATION_OUTPUTS, *metrics)))
        if task.kind == "promote_checkpoint":
            return PROMOTION_OUTPUTS
        return ()

    def store_of(self, gang: TaskPlan, index: int) -> str:
        configured = (gang.config.get("checkpoint") or {}).get("store")
        if not configured:
            return checkpoint_store(self.settings, self.plan.dag_id, gang.task_id)
        path: Path = ("steps", index, "gang_training", "checkpoint", "store")
        inputs: dict[str, str] = {}
        translated = self.translate(configured, path, gang, inputs)
        if inputs:  # other steps' pods compute this URI too, and they have no such input
            self.issue(
                path,
                "a checkpoint store that reads another step's output",
                "a fixed URI, or one made of '{{ params.NAME }}' templates",
            )
        return translated or configured

    def index_of(self, name: str) -> int:
        return next(i for i, t in enumerate(self.plan.tasks) if t.task_id == name)

    # -- templates -------------------------------------------------------------------------
    def reference(self, ref: Reference, task: TaskPlan, inputs: dict[str, str]) -> str:
        if isinstance(ref, ParamRef):
            return f"{{{{workflow.parameters.{ref.name}}}}}"
        assert isinstance(ref, OutputRef)
        source = self.tasks.get(ref.step)
        upstream = sorted(self.ancestors(task))
        if source is None or ref.step not in upstream:
            what = "does not exist" if source is None else f"is not upstream of '{task.task_id}'"
            raise _RefusedError(
                f"reads an output of step '{ref.step}', which {what}",
                f"a step that '{task.task_id}' needs, directly or through others "
                f"({', '.join(upstream) or 'none'}); Argo passes outputs along dependencies only",
            )
        if source.kind == "gang_training":
            if ref.output == "checkpoint_store":
                return self.store_of(source, self.index_of(source.task_id))
            raise _RefusedError(
                f"reads '{ref.output}' of gang step '{ref.step}', which is known only after "
                "the gang ends and is not an output on Argo",
                "'checkpoint_store'; evaluation and promote_checkpoint steps find the "
                "newest committed checkpoint there themselves",
            )
        outputs = self.outputs_of(source)
        if ref.output not in outputs:
            raise _RefusedError(
                f"step '{ref.step}' has no output '{ref.output}'",
                f"one of its outputs: {', '.join(outputs) or 'none'}",
            )
        name = f"{ref.step}_{ref.output}"  # step names have no '_', so this never collides
        inputs[name] = f"{{{{tasks.{ref.step}.outputs.parameters.{ref.output}}}}}"
        return f"{{{{inputs.parameters.{name}}}}}"

    def translate(
        self, text: str, path: Path, task: TaskPlan, inputs: dict[str, str]
    ) -> str | None:
        """``text`` in Argo's template syntax, or None after recording why it has none."""
        try:
            return rewrite(text, lambda ref: self.reference(ref, task, inputs))
        except TemplateError as exc:
            self.issue(path, exc.problem, exc.accepted)
        except _RefusedError as exc:
            self.issue(path, exc.problem, exc.accepted)
        return None

    def translate_tree(self, value: Any, path: Path, task: TaskPlan, inputs: dict[str, str]) -> Any:
        if isinstance(value, str):
            translated = self.translate(value, path, task, inputs)
            return value if translated is None else translated
        if isinstance(value, list):
            return [self.translate_tree(v, (*path, i), task, inputs) for i, v in enumerate(value)]
        if isinstance(value, dict):
            return {k: self.translate_tree(v, (*path, k), task, inputs) for k, v in value.items()}
        return value

    def split(
        self, doc: dict[str, Any], base: Path, task: TaskPlan, inputs: dict[str, str]
    ) -> tuple[dict[str, Any], list[str]]:
        """The executor's view of ``doc``: plain JSON, plus ``--set`` for each templated value.

        Templated values leave the JSON (Argo would substitute into it, and a
        quote in a value would break it); each becomes one argument that Argo
        fills in, typed by its param so the entry point sees a number as a number,
        as Airflow's native rendering gives it.
        """
        sets: list[str] = []

        def walk(value: Any, rel: tuple[str | int, ...]) -> Any:
            if isinstance(value, dict):
                return {k: walk(v, (*rel, k)) for k, v in value.items()}
            if isinstance(value, list):
                return [walk(v, (*rel, i)) for i, v in enumerate(value)]
            if not has_template(value):
                return value
            translated = self.translate(value, (*base, *rel), task, inputs)
            name = exact_param(value)
            kind = value_type(self.spec.params[name]) if name in self.spec.params else "str"
            pointer = "/".join(quote(str(part), safe="") for part in rel)
            if translated is not None:
                sets.extend(["--set", f"{pointer}:{kind}={translated}"])
            return None

        return walk(doc, ()), sets

    def sized(self, value: int | str, path: Path) -> _Sized:
        if isinstance(value, int):
            return _Sized(value, None)
        name = exact_param(value)
        spec = self.spec.params.get(name or "")
        if spec is not None and spec.type == "int":
            return _Sized(int(spec.default), f"{{{{workflow.parameters.{name}}}}}")
        self.issue(
            path,
            f"'{value}' cannot size a gang object",
            "an integer, or '{{ params.NAME }}' of an int param",
        )
        return _Sized(1, None)

    # -- steps -----------------------------------------------------------------------------
    def labels(self, task: TaskPlan) -> dict[str, str]:
        return {
            "tideflow.io/pipeline": dns_label(self.plan.dag_id),
            "tideflow.io/step": dns_label(task.task_id),
            "tideflow.io/team": dns_label(self.plan.team),
        }

    def executor(
        self,
        task: TaskPlan,
        doc: dict[str, Any],
        base: Path,
        inputs: dict[str, str],
        extra: list[str],
    ) -> list[str]:
        static, sets = self.split(doc, base, task, inputs)
        args = [
            task.kind,
            "--pipeline",
            self.plan.dag_id,
            "--team",
            self.plan.team,
            "--step",
            task.task_id,
            "--run-id",
            WORKFLOW_NAME,
        ]
        if task.retries:  # {{retries}} exists only in templates with a retry strategy
            args += ["--attempt", RETRY_NUMBER]
        args += ["--config", json.dumps(static, sort_keys=True, separators=(",", ":")), *sets]
        for name, spec in self.spec.params.items():
            args += ["--param", f"{name}:{value_type(spec)}={{{{workflow.parameters.{name}}}}}"]
        return [*args, *extra, "--outputs", OUTPUTS_DIR]

    def container_step(
        self,
        task: TaskPlan,
        inputs: dict[str, str],
        args: list[str],
        *,
        where: str,
        env: dict[str, str],
        requests: dict[str, str],
        limits: dict[str, str],
        outputs: tuple[str, ...],
    ) -> StepTemplate:
        place = placement(where, self.settings)
        container: dict[str, Any] = {
            "image": self.settings.image,
            "command": list(EXECUTOR),
            "args": args,
            "env": [
                *store_env(self.settings),
                # The image's home may not be writable by the restricted user.
                {"name": "TIDEFLOW_HOME", "value": "/tmp/tideflow"},
                *({"name": k, "value": v} for k, v in env.items()),
            ],
            "resources": {"requests": requests, "limits": limits},
            "securityContext": restricted(),
        }
        env_from = store_env_from(self.settings)
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
            # The step reports to MLflow: its NetworkPolicy admits pods so labelled.
            labels={**self.labels(task), **MLFLOW_CLIENT_LABELS},
            pod=place.apply({"securityContext": restricted_pod()}),
            container=container,
        )

    def step_env(self, task: TaskPlan, base: Path, inputs: dict[str, str]) -> dict[str, str]:
        env = task.config.get("env") or {}
        return {
            k: str(self.translate_tree(v, (*base, "env", k), task, inputs))
            for k, v in sorted(env.items())
        }

    def data_prep(self, index: int, task: TaskPlan) -> StepTemplate:
        config = task.config
        base: Path = ("steps", index, "data_prep")
        for position, name in enumerate(config["outputs"]):
            if not ARGO_NAME.match(name):
                self.issue(
                    (*base, "outputs", position),
                    f"output name '{name}' is not an Argo parameter name",
                    ARGO_NAME_ACCEPTED,
                )
        inputs: dict[str, str] = {}
        doc = {k: config[k] for k in ("entrypoint", "args", "outputs")}
        args = self.executor(task, doc, base, inputs, [])
        resources = config["resources"]
        # A CPU limit would throttle; memory is limited so one step cannot starve a node.
        pool_class = {pool: cls for cls, pool in POOL_FOR_CLASS.items()}.get(config["pool"], "cpu")
        return self.container_step(
            task,
            inputs,
            args,
            where=pool_class,
            env=self.step_env(task, base, inputs),
            requests={"cpu": str(resources["cpu"]), "memory": str(resources["memory"])},
            limits={"memory": str(resources["memory"])},
            outputs=tuple(config["outputs"]),
        )

    def evaluation(self, index: int, task: TaskPlan) -> StepTemplate:
        config = task.config
        base: Path = ("steps", index, "evaluation")
        where = evaluation_device(tuple(config["devices"]), self.inventory)
        place = placement(where, self.settings)
        inputs: dict[str, str] = {}
        extra = ["--device", where]
        gang = task.sources.get("checkpoint")
        if gang is not None:
            extra += ["--checkpoint-store", self.store_of(self.tasks[gang], self.index_of(gang))]
        doc = {k: config[k] for k in ("entrypoint", "args", "metrics")}
        args = self.executor(task, doc, base, inputs, extra)
        env = {
            **self.step_env(task, base, inputs),
            "TIDEFLOW_DEVICE_CLASS": place.device_class,
            "TIDEFLOW_EMULATED": "0",
        }
        devices = place.device_resources()
        return self.container_step(
            task,
            inputs,
            args,
            where=where,
            env=env,
            requests={"cpu": STEP_CPU, "memory": STEP_MEMORY, **devices},
            limits={"memory": STEP_MEMORY, **devices},
            outputs=self.outputs_of(task),
        )

    def promotion(self, index: int, task: TaskPlan) -> StepTemplate | None:
        config = task.config
        base: Path = ("steps", index, "promote_checkpoint")
        gang, scored = task.sources.get("checkpoint"), task.sources.get("metrics")
        if gang is None or scored is None:
            self.issue(
                ("steps", index, "needs"),
                f"step '{task.task_id}' has no upstream "
                f"{'gang_training' if gang is None else 'evaluation'} step to promote from",
                "needs that lead (directly or through other steps) to a gang_training step "
                "and an evaluation step",
            )
            return None
        inputs = {
            f"{scored}_metrics": f"{{{{tasks.{scored}.outputs.parameters.metrics}}}}",
        }
        extra = [
            "--checkpoint-store",
            self.store_of(self.tasks[gang], self.index_of(gang)),
            "--training-step",
            gang,
            "--metrics",
            f"{{{{inputs.parameters.{scored}_metrics}}}}",
        ]
        if self.tasks[scored].sources.get("checkpoint") == gang:
            # Promote exactly the checkpoint that was evaluated.
            name = f"{scored}_checkpoint_step"
            inputs[name] = f"{{{{tasks.{scored}.outputs.parameters.checkpoint_step}}}}"
            extra += ["--checkpoint-step", f"{{{{inputs.parameters.{name}}}}}"]
        doc = {k: config[k] for k in ("model", "alias", "gate", "builder", "args")}
        args = self.executor(task, doc, base, inputs, extra)
        return self.container_step(
            task,
            inputs,
            args,
            where="cpu",
            env={},
            requests={"cpu": STEP_CPU, "memory": STEP_MEMORY},
            limits={"memory": STEP_MEMORY},
            outputs=PROMOTION_OUTPUTS,
        )

    def gang(self, index: int, task: TaskPlan) -> StepTemplate | None:
        config = task.config
        base: Path = ("steps", index, "gang_training")
        entrypoint = config["entrypoint"]
        if isinstance(entrypoint, str):
            self.issue(
                (*base, "entrypoint"),
                f"entry point '{entrypoint}' is module:function; a gang on Kubernetes runs "
                "a command in each worker",
                "a command as a list, such as [python, -m, my.train, --lr, '{{ params.lr }}']",
            )
            return None
        inputs: dict[str, str] = {}
        command = [
            str(self.translate_tree(part, (*base, "entrypoint", i), task, inputs))
            for i, part in enumerate(entrypoint)
        ]
        workers = self.sized(config["workers"], (*base, "workers"))
        per_worker = self.sized(config["devices_per_worker"], (*base, "devices_per_worker"))
        restarts = self.sized(config["max_restarts"], (*base, "max_restarts"))
        checkpoint = self.translate_tree(config["checkpoint"], (*base, "checkpoint"), task, inputs)
        gang_id = f"{self.plan.dag_id}/{WORKFLOW_NAME}/{task.task_id}"
        env = {
            **checkpoint_env(checkpoint, self.store_of(task, index)),
            "TIDEFLOW_GANG_ID": gang_id,
            "MLFLOW_TRACKING_URI": self.settings.mlflow_tracking_uri,
            # No operator makes this step's MLflow run: rank 0 finds or makes it
            # under the workflow's pipeline run (tideflow.runtime.metrics).
            "TIDEFLOW_PIPELINE": self.plan.dag_id,
            "TIDEFLOW_TEAM": self.plan.team,
            "TIDEFLOW_RUN_ID": WORKFLOW_NAME,
            "TIDEFLOW_STEP": task.task_id,
            **self.step_env(task, base, inputs),
        }
        # One Volcano Job per attempt: a retry creates a fresh one, which resumes
        # from the checkpoints the earlier attempt committed to the same store.
        gang_name = f"{WORKFLOW_NAME}-{task.task_id}"
        name = f"{gang_name}-{RETRY_NUMBER}" if task.retries else gang_name
        device = config["device"]
        shape = GangShape(
            name=name,
            labels={
                "tideflow.io/pipeline": dns_label(self.plan.dag_id),
                "tideflow.io/step": dns_label(task.task_id),
                "tideflow.io/run": WORKFLOW_NAME,
            },
            command=command,
            env=env,
            workers=workers.default,
            device_class=device["class"],
            devices_per_worker=per_worker.default,
            model=device.get("model"),
            team=self.plan.team,
            priority=int(config.get("priority", 0)),
            max_restarts=restarts.default,
        )
        job = gang_volcano_job(shape, gang_id, self.settings)
        self.fill_in(
            job,
            gang_name=gang_name,
            device_class=shape.device_class,
            workers=workers,
            per_worker=per_worker,
            restarts=restarts,
        )
        resource_pod = placement("cpu", self.settings).apply({"securityContext": restricted_pod()})
        return StepTemplate(
            name=task.task_id,
            kind=task.kind,
            dependencies=task.upstream,
            arguments=dict(sorted(inputs.items())),
            outputs=(),
            retries=task.retries,
            timeout_seconds=task.timeout_seconds,
            labels=self.labels(task),
            pod=resource_pod,
            manifest=manifest_yaml(job),
            success_condition=SUCCESS,
            failure_condition=FAILURE,
        )

    def fill_in(
        self,
        job: dict[str, Any],
        *,
        gang_name: str,
        device_class: str,
        workers: _Sized,
        per_worker: _Sized,
        restarts: _Sized,
    ) -> None:
        """What only the workflow run knows: its gang label, and sizes set by parameters."""
        spec = job["spec"]
        (worker,) = spec["tasks"]
        # The broker groups pods into gangs by this label: one value per workflow run.
        for labels in (job["metadata"]["labels"], worker["template"]["metadata"]["labels"]):
            labels["tideflow.io/gang"] = gang_name
        pod = worker["template"]["spec"]
        (container,) = pod["containers"]
        if workers.expression:
            spec["minAvailable"] = ArgoInt(workers.expression)
            worker["replicas"] = ArgoInt(workers.expression)
            for variable in container["env"]:
                if variable["name"] == "WORLD_SIZE":
                    variable["value"] = workers.expression
        if restarts.expression:  # maxRetry is one more than the restarts (volcano_max_retry)
            parameter = restarts.expression.removeprefix("{{").removesuffix("}}")
            spec["maxRetry"] = ArgoInt(f"{{{{=asInt({parameter}) + 1}}}}")
        if per_worker.expression:
            resource = DEVICE_RESOURCES.get(device_class, "cpu")
            for section in container["resources"].values():
                if resource in section:
                    section[resource] = per_worker.expression

    # -- the workflow ----------------------------------------------------------------------
    def pipeline_end(self, name: str) -> StepTemplate:
        """The exit handler: closes the workflow's parent MLflow run with its status.

        Airflow does this in the DAG run's callbacks; on Argo it is the
        workflow's ``onExit`` template, which runs whether the DAG succeeded.
        """
        task = TaskPlan(
            task_id=name,
            kind="pipeline_end",
            operator="",
            upstream=(),
            pool="",
            pool_slots=1,
            retries=2,  # MLflow briefly down should not leave the run open
            timeout_seconds=300,
            config={},
        )
        args = self.executor(
            task, {}, ("metadata",), {}, ["--set", "status:str={{workflow.status}}"]
        )
        return self.container_step(
            task,
            {},
            args,
            where="cpu",
            env={},
            requests={"cpu": "100m", "memory": "512Mi"},
            limits={"memory": "512Mi"},
            outputs=(),
        )

    def schedule(self) -> str | None:
        """The pipeline's schedule as an Argo CronWorkflow reads it (cron fields pass as is)."""
        schedule = self.plan.schedule
        if schedule is None or not schedule.startswith("@"):
            return schedule
        if schedule not in ARGO_SCHEDULES:
            self.issue(
                ("metadata", "schedule"),
                f"schedule '{schedule}' has no Argo CronWorkflow form",
                "a cron expression, one of " + ", ".join(ARGO_SCHEDULES) + ", or null "
                "(then submit the WorkflowTemplate yourself)",
            )
            return None
        return ARGO_SCHEDULES[schedule]

    def compile(self) -> WorkflowPlan:
        builders = {
            "data_prep": self.data_prep,
            "evaluation": self.evaluation,
            "promote_checkpoint": self.promotion,
            "gang_training": self.gang,
        }
        steps = [builders[task.kind](i, task) for i, task in enumerate(self.plan.tasks)]
        schedule = self.schedule()
        if self.issues:
            raise SpecError(self.file, self.issues)
        names = {task.task_id for task in self.plan.tasks}
        entrypoint, exit_handler = (
            next(n for n in (base, *(f"{base}-{i}" for i in range(1, 99))) if n not in names)
            for base in ("pipeline", "pipeline-end")
        )
        params = tuple(
            WorkflowParam(
                name,
                param_text(spec.default),
                spec.description,
                tuple(param_text(v) for v in spec.values) if spec.values is not None else None,
            )
            for name, spec in self.spec.params.items()
        )
        annotations = {}
        if self.plan.description:
            annotations["workflows.argoproj.io/description"] = self.plan.description
        return WorkflowPlan(
            name=self.plan.dag_id,
            namespace=self.settings.namespace,
            labels={
                "tideflow.io/pipeline": dns_label(self.plan.dag_id),
                "tideflow.io/team": dns_label(self.plan.team),
            },
            annotations=annotations,
            entrypoint=entrypoint,
            params=params,
            steps=tuple(step for step in steps if step is not None),
            on_exit=self.pipeline_end(exit_handler),
            schedule=schedule,
            service_account=self.settings.argo_service_account,
            executor_service_account=self.settings.argo_executor_service_account,
        )


def compile_workflow(
    spec: PipelineSpec,
    *,
    settings: KubeSettings,
    inventory: Inventory | None = None,
    file: str = "<pipeline>",
    positions: Positions | None = None,
) -> WorkflowPlan:
    """Pure: the same spec and settings always give the same plan.

    Raises ``SpecError`` naming ``file`` and each step field that has no Argo
    form (located by ``positions`` when given), all problems at once.
    """
    return _Compiler(spec, settings, inventory, file, positions or Positions()).compile()
