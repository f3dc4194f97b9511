"""The base of every spec model, of the pipeline file and of the cluster and teams files."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class SpecModel(BaseModel):
    """Base for every spec model: immutable, and unknown keys are errors, not ignored."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)
