"""Pipeline spec v1: the typed, frozen form of a ``pipelines/*.yaml`` file.

Models only describe shape and per-field rules. Rules that span fields of
different steps (``needs`` that exist, no cycles, unique names, params that
templates refer to, gangs that fit the cluster) live in ``tideflow.spec.checks``
so that they can run even when some step fails its own validation.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from croniter import croniter
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    field_validator,
    model_validator,
)

from tideflow.spec.fields import (
    CpuQuantity,
    DurationSeconds,
    EntryPoint,
    EnumValue,
    ImageRef,
    MemoryQuantity,
    Name,
    StrictNumber,
    fail,
    strict_int,
    templated_float,
    templated_int,
)

API_VERSION = "tideflow/v1"
STEP_KINDS = ("data_prep", "gang_training", "evaluation", "promote_checkpoint")
AIRFLOW_PRESETS = (
    "@once",
    "@continuous",
    "@hourly",
    "@daily",
    "@weekly",
    "@monthly",
    "@quarterly",
    "@yearly",
)
EVALUATION_DEVICES = ("npu", "gpu-spare", "gpu", "cpu")
PACKAGE_PATTERN = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$"


class SpecModel(BaseModel):
    """Base for every spec model: immutable, and unknown keys are errors, not ignored."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Metadata(SpecModel):
    name: Name = Field(description="Pipeline name; also the Airflow DAG id.")
    team: Name = Field(description="Owning team; used for queues, quotas and accounting.")
    description: str = ""
    owners: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    schedule: str | None = Field(
        default=None,
        description="Cron expression (5 fields), an Airflow preset such as '@daily', "
        "or null for manual runs only.",
    )
    priority_class: Name | None = Field(
        default=None,
        description="The cluster file's priority class for this pipeline's gangs (its "
        "value becomes their priority; a class with 'preempts' may stop lower-priority "
        "gangs). The DAG's 'priority_class' param may choose another class the team may "
        "use. null: the team's default_priority_class, else the steps' own priority.",
    )
    paused_at_creation: StrictBool | None = Field(
        default=None,
        description="Whether Airflow creates the DAG paused (true) or active (false) when "
        "it first sees the pipeline; null: the deployment's [core] "
        "dags_are_paused_at_creation (true unless changed). Only at creation: afterwards "
        "the UI's toggle, 'airflow dags pause|unpause' or the REST API decide. A paused "
        "DAG's runs, a REST trigger's too, wait as 'queued' until it is unpaused.",
    )

    @field_validator("schedule")
    @classmethod
    def _valid_schedule(cls, value: str | None) -> str | None:
        if value is None or value in AIRFLOW_PRESETS:
            return value
        if len(value.split()) != 5 or not croniter.is_valid(value):
            raise fail(
                f"'{value}' is not a valid cron expression",
                "five fields 'minute hour day-of-month month day-of-week' such as "
                f"'0 2 * * *', one of {', '.join(AIRFLOW_PRESETS)}, or null",
            )
        return value


ParamType = Literal["string", "int", "float", "bool", "enum"]


class ParamSpec(SpecModel):
    """A run parameter; becomes an Airflow ``Param`` and so a field of the trigger form."""

    type: ParamType
    default: Any = Field(description="Value used when the run does not set the parameter.")
    description: str = ""
    minimum: StrictNumber | None = None
    maximum: StrictNumber | None = None
    values: tuple[EnumValue, ...] | None = Field(
        default=None, description="The choices of an 'enum' parameter."
    )

    @field_validator("minimum", "maximum")
    @classmethod
    def _finite_bound(cls, value: float | None) -> float | None:
        # NaN would pass every comparison with it, and an infinite bound is no bound
        if value is not None and not math.isfinite(value):
            raise fail(f"{value} is not a finite number", "a finite bound, or none")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ParamSpec:
        numeric = self.type in ("int", "float")
        if not numeric and (self.minimum is not None or self.maximum is not None):
            raise fail(
                f"minimum/maximum do not apply to a '{self.type}' parameter",
                "bounds only on 'int' or 'float' parameters",
            )
        if self.type == "enum" and not self.values:
            raise fail("an 'enum' parameter needs 'values'", "values: [choice-a, choice-b, ...]")
        if self.type != "enum" and self.values is not None:
            raise fail(
                f"'values' does not apply to a '{self.type}' parameter",
                "'values' only on 'enum' parameters",
            )
        self._check_default()
        return self

    def _check_default(self) -> None:
        value = self.default
        expected: dict[str, tuple[type, ...]] = {
            "string": (str,),
            "int": (int,),
            "float": (int, float),
            "bool": (bool,),
        }
        if self.type == "enum":
            if value not in (self.values or ()):
                raise fail(
                    f"default {value!r} is not one of the values",
                    f"one of {list(self.values or ())}",
                )
            return
        if isinstance(value, bool) and self.type != "bool":
            raise fail(f"default {value!r} is not a {self.type}", f"a {self.type} value")
        if not isinstance(value, expected[self.type]):
            raise fail(f"default {value!r} is not a {self.type}", f"a {self.type} value")
        if not isinstance(value, (int, float)):
            return
        if not math.isfinite(value):
            raise fail(f"default {value} is not a finite number", f"a finite {self.type}")
        if self.minimum is not None and value < self.minimum:
            raise fail(
                f"default {value} is below minimum {self.minimum}", f"a default >= {self.minimum}"
            )
        if self.maximum is not None and value > self.maximum:
            raise fail(
                f"default {value} is above maximum {self.maximum}", f"a default <= {self.maximum}"
            )


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


class Code(SpecModel):
    """Where the pipeline's own Python modules are found, by every step."""

    path: str | None = Field(
        default=None,
        description="A directory of the pipeline's modules, relative to this file (or "
        "absolute); first on PYTHONPATH of every step process tideflow starts on this "
        "machine or under Airflow.",
    )
    package: str | None = Field(
        default=None,
        description="An import package installed where the steps run (this environment "
        "and the step images); nothing is added to the search path.",
    )
    image_path: str | None = Field(
        default=None,
        description="With 'path': the same directory inside the step images (absolute); "
        "first on PYTHONPATH of Argo step pods and of gang pods on Kubernetes.",
    )

    @field_validator("path")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or "{{" in value):
            raise fail(
                f"{value!r} is not a directory path",
                "a directory relative to the pipeline file, such as './src' (no templates)",
            )
        return value

    @field_validator("package")
    @classmethod
    def _package(cls, value: str | None) -> str | None:
        if value is not None and not re.match(PACKAGE_PATTERN, value):
            raise fail(
                f"'{value}' is not an import package name",
                "a dotted Python package name such as 'vision_train' or 'team.models'",
            )
        return value

    @field_validator("image_path")
    @classmethod
    def _image_path(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or "{{" in value):
            raise fail(
                f"'{value}' is not an absolute path",
                "the directory's absolute path inside the image, such as '/opt/team/src'",
            )
        return value

    @model_validator(mode="after")
    def _one_place(self) -> Code:
        if (self.path is None) == (self.package is None):
            what = "both 'path' and 'package'" if self.path else "neither 'path' nor 'package'"
            raise fail(
                f"code has {what}",
                "either 'path: ./src' (a directory next to the pipeline) or "
                "'package: NAME' (an installed package)",
            )
        if self.image_path is not None and self.path is None:
            raise fail(
                "'image_path' goes with 'path'",
                "'path' and 'image_path' together, or 'package' alone",
            )
        return self


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


class Step(SpecModel):
    name: Name
    needs: tuple[str, ...] = ()
    retries: strict_int(ge=0, le=20) = 0  # type: ignore[valid-type]
    timeout: DurationSeconds | None = None
    image: ImageRef | None = Field(
        default=None,
        description="Container image of this step on a cluster (its pods, or a gang's "
        "workers); overrides the pipeline's 'image'.",
    )
    data_prep: DataPrep | None = None
    gang_training: GangTraining | None = None
    evaluation: Evaluation | None = None
    promote_checkpoint: PromoteCheckpoint | None = None

    @model_validator(mode="after")
    def _exactly_one_kind(self) -> Step:
        present = [kind for kind in STEP_KINDS if getattr(self, kind) is not None]
        if len(present) != 1:
            what = "no step kind" if not present else f"several kinds ({', '.join(present)})"
            raise fail(f"step '{self.name}' has {what}", f"exactly one of {', '.join(STEP_KINDS)}")
        return self

    @property
    def kind(self) -> str:
        return next(kind for kind in STEP_KINDS if getattr(self, kind) is not None)

    @property
    def body(self) -> DataPrep | GangTraining | Evaluation | PromoteCheckpoint:
        body = getattr(self, self.kind)
        assert body is not None
        return body  # type: ignore[no-any-return]


class PipelineSpec(SpecModel):
    api_version: Literal["tideflow/v1"] = Field(alias="apiVersion")
    kind: Literal["Pipeline"]
    metadata: Metadata
    params: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], ParamSpec] = Field(
        default_factory=dict
    )
    code: Code | None = Field(
        default=None, description="Where the pipeline's own modules are, for every step."
    )
    image: ImageRef | None = Field(
        default=None,
        description="Container image of every step on a cluster; defaults to the "
        "platform's (TIDEFLOW_K8S_IMAGE).",
    )
    steps: tuple[Step, ...] = Field(min_length=1)
    # The directory of the file the spec was read from (set by the loader): a relative
    # code.path is resolved against it.
    _source_dir: Path | None = PrivateAttr(default=None)

    def step(self, name: str) -> Step:
        return next(step for step in self.steps if step.name == name)

    @property
    def source_dir(self) -> Path | None:
        return self._source_dir

    def code_dir(self) -> Path | None:
        """The absolute directory of ``code.path`` (relative to the pipeline's file)."""
        if self.code is None or self.code.path is None:
            return None
        path = Path(self.code.path).expanduser()
        if not path.is_absolute():
            path = (self._source_dir or Path.cwd()) / path
        return Path(os.path.normpath(path.absolute()))

    def image_for(self, step: Step) -> str | None:
        """The image ``step`` runs in on a cluster: its own, else the pipeline's."""
        return step.image or self.image
