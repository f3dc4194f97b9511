"""A gang training step as the compiler plans it: one typed value, built from the spec's
``GangTraining``, that travels to wherever the gang runs.

The Airflow operator gets it whole; Airflow renders its templated fields one by one
and the operator puts them back into it (``GangTrainingOperator.step_plan``). An Argo
workflow's gang driver gets it as JSON (``gang_plan_to_json``, read back with
``gang_plan_from_json``). Where it runs, ``tideflow.gangs.resolve_gang`` turns the
rendered plan into the gang of one run.

Every default is the spec model's: the compiler takes the validated model's values,
and a JSON document that leaves a field out gets the value ``GangTraining`` gives it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TypeAlias

from tideflow.spec.step_kinds import DeviceClass, GangTraining, KeepBest

JsonValue: TypeAlias = "bool | int | float | str | list[JsonValue] | dict[str, JsonValue] | None"
# A JSON object. The step's ``args`` are one, free-form on purpose: they are the user's
# keyword arguments for their entry point (or a command's options), which tideflow only
# renders and passes on, so no schema of ours can name their keys or types.
JsonObject: TypeAlias = "dict[str, JsonValue]"
# An integer, or a '{{ ... }}' template until the task renders it.
TemplatedInt: TypeAlias = int | str


@dataclass(frozen=True)
class CheckpointPlan:
    """The step's ``checkpoint`` policy (the spec's ``CheckpointPolicy``)."""

    store: str | None  # a root the team may write to; None: the artifact root
    every_steps: TemplatedInt | None
    every_seconds: int | None
    keep_last: TemplatedInt
    keep_best: KeepBest | None
    optional: bool  # committing no checkpoint warns instead of failing

    def env(self, uri: str) -> dict[str, str]:
        """The policy and its store ``uri`` as the ``TIDEFLOW_*`` variables the workers'
        runtime reads."""
        env = {"TIDEFLOW_CHECKPOINT_URI": uri, "TIDEFLOW_KEEP_LAST": str(self.keep_last)}
        if self.every_steps:
            env["TIDEFLOW_CHECKPOINT_EVERY_STEPS"] = str(self.every_steps)
        if self.every_seconds:
            env["TIDEFLOW_CHECKPOINT_EVERY_SECONDS"] = str(self.every_seconds)
        if self.keep_best is not None:
            env["TIDEFLOW_KEEP_BEST_METRIC"] = self.keep_best.metric
            env["TIDEFLOW_KEEP_BEST_MODE"] = self.keep_best.mode
        return env


@dataclass(frozen=True)
class GangStepPlan:
    """A ``gang_training`` step: the spec's fields, and what the pipeline adds to them.

    ``TemplatedInt`` fields (and the strings in ``entrypoint``, ``args``, ``env``) may be
    templates until the task renders them; ``resolve_gang`` reads a rendered plan.
    """

    entrypoint: str | tuple[str, ...]  # module:function, or a command
    args: JsonObject
    env: dict[str, str]
    workers: TemplatedInt
    min_workers: TemplatedInt | None  # elastic when below ``workers``
    devices_per_worker: TemplatedInt
    device_class: DeviceClass
    device_model: str | None
    checkpoint: CheckpointPlan
    max_restarts: TemplatedInt
    hang_timeout: int | None  # seconds without progress before a restart; None: never
    priority: int
    preemptible: bool
    cpu: str | None  # per worker, besides its devices (None: not asked for)
    memory: str | None
    # The pipeline's: the workers' image on a cluster (None: the platform's), the
    # pipeline's code inside it, and the run's priority class (the pipeline names one:
    # '{{ params.priority_class }}' until rendered; None: the run names none).
    image: str | None
    code_image_path: str | None
    priority_class: str | None


def gang_step_plan(
    body: GangTraining,
    *,
    image: str | None,
    code_image_path: str | None,
    priority_class: str | None,
) -> GangStepPlan:
    """The plan of a validated ``gang_training`` step (every default is the model's)."""
    return gang_plan_from_json(
        {
            **body.model_dump(mode="json", by_alias=True),
            **_pipeline_json(image, code_image_path, priority_class),
        }
    )


def gang_plan_to_json(plan: GangStepPlan, *, step_only: bool = False) -> JsonObject:
    """The plan as JSON: the spec's fields as the spec model dumps them (same keys, same
    order), then the pipeline's (``image``, ``code``, ``priority_class``) where set,
    unless ``step_only``."""
    checkpoint = plan.checkpoint
    doc: JsonObject = {
        "entrypoint": plan.entrypoint if isinstance(plan.entrypoint, str) else [*plan.entrypoint],
        "args": dict(plan.args),
        "env": dict(plan.env),
        "workers": plan.workers,
        "min_workers": plan.min_workers,
        "devices_per_worker": plan.devices_per_worker,
        "device": {"class": plan.device_class, "model": plan.device_model},
        "checkpoint": checkpoint_to_json(checkpoint),
        "max_restarts": plan.max_restarts,
        "hang_timeout": plan.hang_timeout,
        "priority": plan.priority,
        "preemptible": plan.preemptible,
        "resources": {"cpu": plan.cpu, "memory": plan.memory},
    }
    if step_only:
        return doc
    return {**doc, **_pipeline_json(plan.image, plan.code_image_path, plan.priority_class)}


def _pipeline_json(
    image: str | None, code_image_path: str | None, priority_class: str | None
) -> JsonObject:
    doc: JsonObject = {}
    if image:
        doc["image"] = image
    if code_image_path:
        doc["code"] = {"image_path": code_image_path}
    if priority_class:
        doc["priority_class"] = priority_class
    return doc


def checkpoint_to_json(checkpoint: CheckpointPlan) -> JsonObject:
    best = checkpoint.keep_best
    return {
        "store": checkpoint.store,
        "every_steps": checkpoint.every_steps,
        "every_seconds": checkpoint.every_seconds,
        "keep_last": checkpoint.keep_last,
        "keep_best": None if best is None else {"metric": best.metric, "mode": best.mode},
        "optional": checkpoint.optional,
    }


def gang_plan_from_json(doc: JsonObject) -> GangStepPlan:
    """The plan of a JSON document: ``gang_plan_to_json``'s, or one whose templated
    values a workflow filled in. A field it leaves out (or an object it gives as null)
    takes the spec model's default.

    ``TypeError`` for a value of the wrong kind (``ValueError`` for a bad ``keep_best``).
    """
    defaults = _spec_defaults()
    given = {key: value for key, value in doc.items() if value is not None or key in _NULLABLE}
    fields = {**defaults, **given}

    def merged(key: str) -> JsonObject:  # a nested object: its own defaults filled in
        return {**_object(defaults.get(key)), **_object(given.get(key))}

    device, resources = merged("device"), merged("resources")
    entrypoint = fields["entrypoint"]
    return GangStepPlan(
        entrypoint=entrypoint if isinstance(entrypoint, str) else _strings(entrypoint),
        args=_object(fields["args"]),
        env={str(key): str(value) for key, value in _object(fields["env"]).items()},
        workers=_templated_int(fields["workers"]),
        min_workers=_optional_templated_int(fields["min_workers"]),
        devices_per_worker=_templated_int(fields["devices_per_worker"]),
        device_class=_device_class(device["class"]),
        device_model=_optional_text(device.get("model")),
        checkpoint=checkpoint_from_json(_object(given.get("checkpoint"))),
        max_restarts=_templated_int(fields["max_restarts"]),
        hang_timeout=_optional_int(fields["hang_timeout"]),
        priority=_int(fields["priority"]),
        preemptible=bool(fields["preemptible"]),
        cpu=_optional_text(resources["cpu"]),
        memory=_optional_text(resources["memory"]),
        image=_optional_text(fields.get("image")),
        code_image_path=_optional_text(_object(fields.get("code")).get("image_path")),
        priority_class=_optional_text(fields.get("priority_class")),
    )


def checkpoint_from_json(doc: JsonObject) -> CheckpointPlan:
    """The ``checkpoint`` policy of a JSON document; what it leaves out is the spec's."""
    fields = {**_object(_spec_defaults()["checkpoint"]), **doc}
    return CheckpointPlan(
        store=_optional_text(fields["store"]),
        every_steps=_optional_templated_int(fields["every_steps"]),
        every_seconds=_optional_int(fields["every_seconds"]),
        keep_last=_templated_int(fields["keep_last"]),
        keep_best=_keep_best(fields["keep_best"]),
        optional=bool(fields["optional"]),
    )


# Fields whose null is a value (no minimum, no hang timeout) rather than "the default".
_NULLABLE = frozenset({"min_workers", "hang_timeout"})


@cache
def _spec_defaults() -> JsonObject:
    """``GangTraining``'s defaults as JSON (never modified: callers copy)."""
    # entrypoint and workers have no defaults: every document names them
    dumped = GangTraining.model_construct(entrypoint="", workers=1).model_dump(
        mode="json", by_alias=True
    )
    return {key: value for key, value in dumped.items() if key not in ("entrypoint", "workers")}


def _object(value: JsonValue) -> JsonObject:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"{value!r} is not an object")
    return value


def _strings(value: JsonValue) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise TypeError(f"{value!r} is neither module:function nor a command (a list)")
    return tuple(str(part) for part in value)


def _int(value: JsonValue) -> int:
    if isinstance(value, list | dict) or value is None:
        raise TypeError(f"{value!r} is not an integer")
    return int(value)  # text too: a rendered template, as the operator gets it


def _optional_int(value: JsonValue) -> int | None:
    return None if value in (None, "") else _int(value)


def _templated_int(value: JsonValue) -> TemplatedInt:
    """An integer, or text: a template, or a rendered value still to be read as one."""
    return value if isinstance(value, str) else _int(value)


def _optional_templated_int(value: JsonValue) -> TemplatedInt | None:
    return None if value in (None, "") else _templated_int(value)


def _optional_text(value: JsonValue) -> str | None:
    return None if value in (None, "") else str(value)


_DEVICE_CLASSES: dict[str, DeviceClass] = {"cpu": "cpu", "gpu": "gpu", "npu": "npu"}


def _device_class(value: JsonValue) -> DeviceClass:
    if isinstance(value, str) and value in _DEVICE_CLASSES:
        return _DEVICE_CLASSES[value]
    raise TypeError(f"{value!r} is not a device class (cpu, gpu or npu)")


def _keep_best(value: JsonValue) -> KeepBest | None:
    return None if value is None else KeepBest.model_validate(value)
