"""The context handed to a step's entry point, passed to its process as a JSON file."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tideflow.settings_registry.declared_worker import STEP_RUN_ENV
from tideflow.storage import Store, open_store, safe_segment
from tideflow.storage.keys import dns_label

CONTEXT_ENV = "TIDEFLOW_STEP_CONTEXT"
OUTPUTS_ENV = "TIDEFLOW_STEP_OUTPUTS"
GANG_ID_ENV = "TIDEFLOW_GANG_ID"  # a gang's workers: their gang's id (StepRun.gang_id)

# The labels of a step run's Kubernetes objects, each value a ``dns_label``. The broker
# finds a gang's pods by GANG_LABEL and reads whose quota they run on from TEAM_LABEL
# (tideflow.broker).
PIPELINE_LABEL = "tideflow.io/pipeline"
STEP_LABEL = "tideflow.io/step"
RUN_LABEL = "tideflow.io/run"
GANG_LABEL = "tideflow.io/gang"
TEAM_LABEL = "tideflow.io/team"


def pipeline_labels(pipeline: str, team: str, *, step: str | None = None) -> dict[str, str]:
    """Labels of a pipeline's objects compiled before any run (its Argo Workflow) and,
    with ``step``, of that step's pods there (its template's)."""
    labels = {PIPELINE_LABEL: dns_label(pipeline)}
    if step is not None:
        labels[STEP_LABEL] = dns_label(step)
    labels[TEAM_LABEL] = dns_label(team)
    return labels


def gang_labels(gang_id: str, team: str) -> dict[str, str]:
    """The labels every gang object and its pods carry, whoever built its job."""
    return {GANG_LABEL: dns_label(gang_id), TEAM_LABEL: dns_label(team)}


def gang_selector(gang_id: str) -> str:
    """The label selector of a gang's objects and pods, by its id (``gang_labels``)."""
    return f"{GANG_LABEL}={dns_label(gang_id)}"


@dataclass(frozen=True)
class StepRun:
    """One step of one pipeline run, as every place names it: its gang's id and its
    artifacts' key prefix. No try number: a retry is the same step run (it reattaches
    to its gang, resumes from its checkpoints)."""

    pipeline: str
    run_id: str
    step: str

    @property
    def gang_id(self) -> str:
        """Stable across retries of the same step in the same run (Airflow's or Argo's)."""
        return f"{self.pipeline}/{self.run_id}/{self.step}"

    @property
    def key_prefix(self) -> str:
        """Key prefix of this step's artifacts: ``PIPELINE/RUN/STEP``, each part key-safe."""
        return "/".join(safe_segment(part) for part in (self.pipeline, self.run_id, self.step))

    def labels(self) -> dict[str, str]:
        """Its gang object's and pods' labels: pipeline, step, run (``gang_labels`` adds
        the gang and team)."""
        return {
            PIPELINE_LABEL: dns_label(self.pipeline),
            STEP_LABEL: dns_label(self.step),
            RUN_LABEL: dns_label(self.run_id),
        }

    def env(self, team: str) -> dict[str, str]:
        """The step run in its workers' environment, as the runtime reads it to find or
        make the step's MLflow run (``STEP_RUN_ENV``, tideflow.runtime.metrics)."""
        return dict(zip(STEP_RUN_ENV, (self.pipeline, team, self.run_id, self.step), strict=True))


@dataclass(frozen=True)
class StepContext:
    pipeline: str
    team: str
    step: str
    dag_id: str
    run_id: str
    try_number: int
    artifact_root: str
    params: dict[str, Any] = field(default_factory=dict)
    outputs: tuple[str, ...] = ()

    @property
    def run(self) -> StepRun:
        return StepRun(self.pipeline, self.run_id, self.step)

    @property
    def run_prefix(self) -> str:
        """Key prefix of this step's artifacts: ``PIPELINE/RUN/STEP`` (``StepRun``)."""
        return self.run.key_prefix

    def store(self) -> Store:
        return open_store(self.artifact_root)

    def artifact_key(self, name: str) -> str:
        return f"{self.run_prefix}/{name}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, default=str)

    @classmethod
    def from_json(cls, text: str) -> StepContext:
        data = json.loads(text)
        data["outputs"] = tuple(data.get("outputs", ()))
        return cls(**data)

    @classmethod
    def from_file(cls, path: Path) -> StepContext:
        return cls.from_json(path.read_text(encoding="utf-8"))
