"""MLflow bookkeeping: one parent run per DAG run, one nested run per step."""

from tideflow.tracking.runs import RunIds, ensure_runs, finish_step_run, tracking_enabled

__all__ = ["RunIds", "ensure_runs", "finish_step_run", "tracking_enabled"]
