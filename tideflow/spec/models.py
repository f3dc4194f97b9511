"""Pipeline spec v1: the typed, frozen form of a ``pipelines/*.yaml`` file.

Its top level, metadata, params, code and steps are here; the body of each step
kind (data prep, gang training, evaluation, promotion) is in
``tideflow.spec.step_kinds``, and the base every model shares in ``tideflow.spec.base``.

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
    Field,
    PrivateAttr,
    StrictBool,
    field_validator,
    model_validator,
)

from tideflow.spec.base import SpecModel
from tideflow.spec.fields import (
    DurationSeconds,
    EnumValue,
    ImageRef,
    Name,
    StrictNumber,
    fail,
    strict_int,
)
from tideflow.spec.step_kinds import (
    STEP_KINDS,
    DataPrep,
    Evaluation,
    GangTraining,
    PromoteCheckpoint,
)

API_VERSION = "tideflow/v1"
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
PACKAGE_PATTERN = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$"


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
