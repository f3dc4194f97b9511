"""The context handed to a step's entry point, passed to its process as a JSON file."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tideflow.storage import Store, open_store, safe_segment

CONTEXT_ENV = "TIDEFLOW_STEP_CONTEXT"
OUTPUTS_ENV = "TIDEFLOW_STEP_OUTPUTS"


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
