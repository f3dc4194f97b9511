"""Pipeline spec v1: models, loading with located errors, cross-step checks."""

from tideflow.spec.errors import SpecError, SpecIssue
from tideflow.spec.loader import find_pipelines, load_model, load_pipeline, parse_model
from tideflow.spec.models import PipelineSpec, Step

__all__ = [
    "PipelineSpec",
    "SpecError",
    "SpecIssue",
    "Step",
    "find_pipelines",
    "load_model",
    "load_pipeline",
    "parse_model",
]
