"""The step kinds of a pipeline spec: what a step of each kind declares.

A step (``tideflow.spec.models.Step``) holds exactly one of these bodies, under
the key of its kind. Models only describe shape and per-field rules; rules across
steps live in ``tideflow.spec.checks``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from tideflow.spec.base import SpecModel
from tideflow.spec.fields import (
    CpuQuantity,
    DurationSeconds,
    EntryPoint,
    MemoryQuantity,
    fail,
    strict_int,
    templated_float,
    templated_int,
)

# The keys of a step, one per kind: a step has exactly one of them.
STEP_KINDS = ("data_prep", "gang_training", "evaluation", "promote_checkpoint")
EVALUATION_DEVICES = ("npu", "gpu-spare", "gpu", "cpu")


class Resources(SpecModel):
    cpu: CpuQuantity = "1"
    memory: MemoryQuantity = "1Gi"


class WorkerResources(SpecModel):
    """What each gang worker asks for besides its devices (``devices_per_worker``)."""

    cpu: CpuQuantity | None = Field(
        default=None,
        description="CPU per worker of a gpu or npu gang (a cpu gang's cores are its "
        "devices_per_worker); a request of each pod on Kubernetes.",
    )
    memory: MemoryQuantity | None = Field(
        default=None,
        description="Memory per worker; request and limit of each pod on Kubernetes.",
    )


class StepBody(SpecModel):
    """Fields every runnable step kind shares."""

    entrypoint: EntryPoint = Field(
        description="'package.module:function' or a command as a list of strings."
    )
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments for the entry point; values may use "
        "'{{ params.NAME }}' templates.",
    )
    env: dict[str, str] = Field(default_factory=dict)


class DataPrep(StepBody):
    resources: Resources = Resources()
    pool: str = Field(default="tideflow-cpu", description="Airflow pool the task runs in.")
    outputs: tuple[str, ...] = Field(
        default=(),
        description="Names of the outputs (paths or URIs) the entry point returns; "
        "downstream steps read them from XCom.",
    )


DeviceClass = Literal["cpu", "gpu", "npu"]


class Device(SpecModel):
    device_class: DeviceClass = Field(alias="class")
    model: str | None = Field(default=None, description="e.g. H100, A100, Ascend910")

    @model_validator(mode="after")
    def _model_only_for_accelerators(self) -> Device:
        if self.device_class == "cpu" and self.model is not None:
            raise fail("a 'cpu' device has no model", "omit 'model', or use class gpu/npu")
        return self


class KeepBest(SpecModel):
    metric: str
    mode: Literal["max", "min"] = "max"


class CheckpointPolicy(SpecModel):
    store: str | None = Field(
        default=None,
        description=(
            "A root (file:// or s3://) the gang's checkpoints go under, as "
            "<root>/<pipeline>/<run>/<step>/checkpoints; the artifact root or one "
            "TIDEFLOW_CHECKPOINT_ROOTS declares for the team. Defaults to the artifact root."
        ),
    )
    every_steps: templated_int(ge=1) | None = None  # type: ignore[valid-type]
    every_seconds: DurationSeconds | None = None
    keep_last: templated_int(ge=1) = 3  # type: ignore[valid-type]
    keep_best: KeepBest | None = None
    optional: bool = Field(
        default=False,
        description=(
            "A gang that commits no checkpoint fails the step (its script never called "
            "tideflow.checkpoints().save); true makes that a warning, for training code "
            "that keeps its model elsewhere."
        ),
    )

    @field_validator("store")
    @classmethod
    def _store_scheme(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("s3://", "file://", "{{")):
            raise fail(
                f"'{value}' is not a supported store URI",
                "an 's3://bucket/prefix' or 'file:///path' URI",
            )
        return value


class GangTraining(StepBody):
    workers: templated_int(ge=1, le=4096)  # type: ignore[valid-type]
    min_workers: templated_int(ge=1, le=4096) | None = Field(  # type: ignore[valid-type]
        default=None, description="Elastic lower bound; defaults to 'workers'."
    )
    devices_per_worker: templated_int(ge=1, le=64) = 1  # type: ignore[valid-type]
    device: Device = Device(**{"class": "cpu"})
    checkpoint: CheckpointPolicy = CheckpointPolicy()
    max_restarts: templated_int(ge=0, le=100) = 3  # type: ignore[valid-type]
    hang_timeout: DurationSeconds | None = Field(
        default=1800,
        description="A gang whose workers make no training progress for this long is "
        "stopped with each rank's stacks in its log and restarted (a second hang at the "
        "same step fails it); null: never. Seconds, or a duration such as '30m'.",
    )
    priority: strict_int(ge=-1000, le=1000) = 0  # type: ignore[valid-type]
    preemptible: bool = True
    resources: WorkerResources = WorkerResources()

    @model_validator(mode="after")
    def _elastic_bounds(self) -> GangTraining:
        if (
            isinstance(self.min_workers, int)
            and isinstance(self.workers, int)
            and self.min_workers > self.workers
        ):
            raise fail(
                f"min_workers {self.min_workers} is larger than workers {self.workers}",
                f"min_workers between 1 and {self.workers}",
            )
        return self


class Evaluation(StepBody):
    devices: tuple[Literal["npu", "gpu-spare", "gpu", "cpu"], ...] = Field(
        default=("npu", "gpu-spare", "cpu"),
        min_length=1,
        description="Device classes in order of preference.",
    )
    metrics: tuple[str, ...] = Field(min_length=1)
    checkpoint: Literal["best", "latest"] = Field(
        default="best",
        description="Which committed checkpoint of the upstream gang step to evaluate (and "
        "so to promote): 'best' by the gang's checkpoint.keep_best metric (the latest when "
        "it declares none or no checkpoint has that metric; the reason is logged), or "
        "'latest'.",
    )


class Threshold(SpecModel):
    min: templated_float() | None = None  # type: ignore[valid-type]
    max: templated_float() | None = None  # type: ignore[valid-type]


class Gate(SpecModel):
    metric: str = Field(
        description="Metric compared with the current champion; one of the metrics the "
        "upstream evaluation step declares."
    )
    mode: Literal["max", "min"] = "max"
    min_delta: templated_float(ge=0) = Field(  # type: ignore[valid-type]
        default=0.0,
        description="The challenger must beat the champion by more than this; a tie "
        "never promotes.",
    )
    thresholds: dict[str, Threshold] = Field(
        default_factory=dict,
        description="Bounds (min, max) per metric; each one of the metrics the upstream "
        "evaluation step declares.",
    )


class PromoteCheckpoint(SpecModel):
    builder: EntryPoint | None = Field(
        default=None,
        description="'module:function' that logs an MLflow model built from the checkpoint "
        "into the given run and returns {'model_uri': ...}; needed to register versions.",
    )
    args: dict[str, Any] = Field(default_factory=dict)
    model: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
        description="Registered model name in the MLflow Model Registry.",
    )
    alias: str = Field(default="champion", pattern=r"^[a-z][a-z0-9_-]{0,62}$")
    gate: Gate
