"""MLflow bookkeeping: one parent run per DAG run, one nested run per step."""

from tideflow.tracking.links import mlflow_ui_base, model_version_url, run_url
from tideflow.tracking.runs import (
    RunIds,
    ensure_runs,
    ensure_workflow_runs,
    finish_pipeline_run,
    finish_step_run,
    finish_step_run_or_warn,
    tracking_enabled,
)

__all__ = [
    "RunIds",
    "ensure_runs",
    "ensure_workflow_runs",
    "finish_pipeline_run",
    "finish_step_run",
    "finish_step_run_or_warn",
    "mlflow_ui_base",
    "model_version_url",
    "run_url",
    "tracking_enabled",
]
