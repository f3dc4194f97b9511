"""Compile a ``PipelineSpec`` into a ``DagPlan``: the Airflow DAG as plain data.

This is a pure function of the spec and the inventory; the Airflow layer
(``tideflow.dag.builder``) only instantiates what the plan says. Keeping the
decisions here means they are tested, and golden-filed, without Airflow.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from tideflow.compile.gang_plan import GangStepPlan, gang_plan_to_json, gang_step_plan
from tideflow.compile.templates import exact_param
from tideflow.spec.models import ParamSpec, PipelineSpec, Step
from tideflow.spec.params import PRIORITY_PARAM, run_params
from tideflow.spec.step_kinds import DataPrep, Evaluation, GangTraining, PromoteCheckpoint

POOL_FOR_CLASS = {"cpu": "tideflow-cpu", "gpu": "tideflow-gpu", "npu": "tideflow-npu"}
OPERATOR_FOR_KIND = {
    "data_prep": "DataPrepOperator",
    "gang_training": "GangTrainingOperator",
    "evaluation": "EvaluationOperator",
    "promote_checkpoint": "PromoteCheckpointOperator",
}
_PARAM_TYPES = {"string": "string", "int": "integer", "float": "number", "bool": "boolean"}


@dataclass(frozen=True)
class ParamPlan:
    default: Any
    type: str | list[str]
    description: str = ""
    minimum: float | None = None
    maximum: float | None = None
    enum: tuple[Any, ...] | None = None

    def param_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``airflow.sdk.Param`` (JSON-schema keywords)."""
        kwargs: dict[str, Any] = {"type": self.type}
        if self.description:
            kwargs["description"] = self.description
        if self.minimum is not None:
            kwargs["minimum"] = self.minimum
        if self.maximum is not None:
            kwargs["maximum"] = self.maximum
        if self.enum is not None:
            kwargs["enum"] = list(self.enum)
        if self.type == "number":  # an "integer" is never NaN or infinite already
            kwargs["not"] = NON_FINITE
        return kwargs


_LARGEST = sys.float_info.max
# JSON Schema has no "finite" keyword, and NaN passes every minimum and maximum
# (each comparison is false). A number matches one of these branches only if it
# is NaN, +inf or -inf, so "not" this refuses exactly the non-finite numbers that
# Python's JSON (the REST API's conf) accepts.
NON_FINITE = {
    "anyOf": [
        {"type": "number", "minimum": _LARGEST, "maximum": -_LARGEST},  # NaN
        {"type": "number", "exclusiveMinimum": _LARGEST},  # +inf
        {"type": "number", "exclusiveMaximum": -_LARGEST},  # -inf
    ]
}


@dataclass(frozen=True)
class TaskPlan:
    task_id: str
    kind: str
    operator: str
    upstream: tuple[str, ...]
    pool: str
    pool_slots: int
    retries: int
    timeout_seconds: int | None
    # The step's spec fields as JSON; a gang step's are its typed ``gang`` plan instead.
    config: dict[str, Any] = field(hash=False)
    # Upstream steps whose XCom outputs this step reads: {"checkpoint": "train", ...}
    sources: dict[str, str] = field(default_factory=dict, hash=False)
    # The step's container image on a cluster (its own, else the pipeline's); None: the
    # platform's default.
    image: str | None = None
    gang: GangStepPlan | None = field(default=None, hash=False)  # a gang_training step's


@dataclass(frozen=True)
class DagPlan:
    dag_id: str
    team: str
    description: str
    schedule: str | None
    owners: tuple[str, ...]
    tags: tuple[str, ...]
    params: dict[str, ParamPlan] = field(hash=False)
    tasks: tuple[TaskPlan, ...]
    # The pipeline's modules (code.path resolved against the pipeline file; put first on
    # PYTHONPATH of every step process), and where the step images hold them.
    code_path: str | None = None
    code_image_path: str | None = None
    # metadata.paused_at_creation: Airflow's is_paused_upon_creation (None: its config's).
    paused_at_creation: bool | None = None
    # metadata.priority_class; the DAG gets a 'priority_class' param defaulting to it.
    priority_class: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The plan as JSON-able data; a gang step's plan is its ``config``, as the spec's."""
        doc = asdict(self)
        for task, task_doc in zip(self.tasks, doc["tasks"], strict=True):
            del task_doc["gang"]
            if task.gang is not None:
                task_doc["config"] = gang_plan_to_json(task.gang, step_only=True)
        return doc

    def keep_best_of(self, task: TaskPlan) -> dict[str, str] | None:
        """The ``checkpoint.keep_best`` (metric, mode) of the gang step ``task`` reads its
        checkpoints from: what an evaluation's ``checkpoint: best`` ranks by."""
        gang = task.sources.get("checkpoint")
        source = next((t for t in self.tasks if t.task_id == gang), None)
        if source is None or source.gang is None:
            return None
        best = source.gang.checkpoint.keep_best
        return None if best is None else {"metric": best.metric, "mode": best.mode}

    def pool_demand(self) -> dict[str, int]:
        """Largest slot count any single task asks of each pool."""
        demand: dict[str, int] = {}
        for task in self.tasks:
            demand[task.pool] = max(demand.get(task.pool, 0), task.pool_slots)
        return demand


def _param_plan(spec: ParamSpec) -> ParamPlan:
    if spec.type == "enum":
        values = tuple(spec.values or ())
        kinds = sorted({"string" if isinstance(v, str) else "number" for v in values})
        return ParamPlan(
            spec.default, kinds[0] if len(kinds) == 1 else kinds, spec.description, enum=values
        )

    def bound(value: float | None) -> float | None:
        # JSON Schema accepts 8.0 as an integer bound, but the trigger form shows "8.0"
        return int(value) if value is not None and spec.type == "int" else value

    return ParamPlan(
        spec.default,
        _PARAM_TYPES[spec.type],
        spec.description,
        bound(spec.minimum),
        bound(spec.maximum),
    )


def _at_default(value: int | str, params: dict[str, ParamSpec]) -> int:
    """A templated integer at its param's default; templates we cannot resolve count as 1."""
    if isinstance(value, int):
        return value
    name = exact_param(value)
    if name in params and isinstance(params[name].default, int):
        return int(params[name].default)
    return 1


def _placement(step: Step, params: dict[str, ParamSpec]) -> tuple[str, int]:
    body = step.body
    if isinstance(body, DataPrep):
        from tideflow.spec.fields import cpu_cores

        return body.pool, max(1, math.ceil(cpu_cores(body.resources.cpu)))
    if isinstance(body, GangTraining):
        devices = _at_default(body.workers, params) * _at_default(body.devices_per_worker, params)
        return POOL_FOR_CLASS[body.device.device_class], devices
    if isinstance(body, Evaluation):
        first = body.devices[0]
        return POOL_FOR_CLASS["cpu" if first == "cpu" else first.split("-")[0]], 1
    assert isinstance(body, PromoteCheckpoint)
    return POOL_FOR_CLASS["cpu"], 1


def _nearest_ancestor(spec: PipelineSpec, step: Step, kind: str) -> str | None:
    """The closest upstream step of ``kind`` (breadth-first over ``needs``)."""
    frontier = list(step.needs)
    seen: set[str] = set()
    while frontier:
        name = frontier.pop(0)
        if name in seen:
            continue
        seen.add(name)
        upstream = spec.step(name)
        if upstream.kind == kind:
            return name
        frontier.extend(upstream.needs)
    return None


def _sources(spec: PipelineSpec, step: Step) -> dict[str, str]:
    wanted = {
        "evaluation": {"checkpoint": "gang_training"},
        "promote_checkpoint": {"checkpoint": "gang_training", "metrics": "evaluation"},
    }
    found = {}
    for role, kind in wanted.get(step.kind, {}).items():
        name = _nearest_ancestor(spec, step, kind)
        if name is not None:
            found[role] = name
    return found


def _gang_plan(spec: PipelineSpec, step: Step) -> GangStepPlan | None:
    """A gang step's plan, with the pipeline's image, code and the run's priority class
    (the DAG's param, or the workflow's parameter, when the pipeline names a class)."""
    if not isinstance(step.body, GangTraining):
        return None
    return gang_step_plan(
        step.body,
        image=spec.image_for(step),
        code_image_path=spec.code.image_path if spec.code is not None else None,
        priority_class=(
            f"{{{{ params.{PRIORITY_PARAM} }}}}" if spec.metadata.priority_class else None
        ),
    )


def compile_dag_plan(spec: PipelineSpec) -> DagPlan:
    """Pure: the same spec always gives the same plan."""
    tasks = []
    for step in spec.steps:
        pool, slots = _placement(step, spec.params)
        gang = _gang_plan(spec, step)
        tasks.append(
            TaskPlan(
                task_id=step.name,
                kind=step.kind,
                operator=OPERATOR_FOR_KIND[step.kind],
                upstream=tuple(step.needs),
                pool=pool,
                pool_slots=slots,
                retries=step.retries,
                timeout_seconds=step.timeout,
                config={} if gang is not None else step.body.model_dump(mode="json", by_alias=True),
                sources=_sources(spec, step),
                image=spec.image_for(step),
                gang=gang,
            )
        )
    meta = spec.metadata
    code_dir = spec.code_dir()
    return DagPlan(
        dag_id=meta.name,
        team=meta.team,
        description=meta.description,
        schedule=meta.schedule,
        owners=meta.owners,
        tags=tuple(dict.fromkeys(("tideflow", f"team:{meta.team}", *meta.tags))),
        params={name: _param_plan(p) for name, p in run_params(spec).items()},
        tasks=tuple(tasks),
        code_path=str(code_dir) if code_dir is not None else None,
        code_image_path=spec.code.image_path if spec.code is not None else None,
        paused_at_creation=meta.paused_at_creation,
        priority_class=meta.priority_class,
    )


def topological_order(plan: DagPlan) -> list[TaskPlan]:
    """Tasks in an order that respects ``upstream``; ties keep the file's order."""
    done: set[str] = set()
    ordered: list[TaskPlan] = []
    pending = list(plan.tasks)
    while pending:
        ready = [t for t in pending if set(t.upstream) <= done]
        if not ready:
            raise ValueError("dependency cycle in plan")  # the spec checks prevent this
        for task in ready:
            ordered.append(task)
            done.add(task.task_id)
            pending.remove(task)
    return ordered
