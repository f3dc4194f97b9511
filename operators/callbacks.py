"""DAG-level callbacks: close the DAG run's parent MLflow run when the DAG run ends."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def _finish(context: Any, succeeded: bool) -> None:
    from tideflow.tracking import finish_pipeline_run, tracking_enabled

    if not tracking_enabled():
        return
    dag_run = context["dag_run"]
    try:
        finish_pipeline_run(
            pipeline=dag_run.dag_id,
            dag_id=dag_run.dag_id,
            dag_run_id=dag_run.run_id,
            succeeded=succeeded,
        )
    except Exception as exc:  # a callback never fails the DAG run over bookkeeping
        log.warning("tideflow: could not close the MLflow run of %s: %s", dag_run.run_id, exc)


def pipeline_run_succeeded(context: Any) -> None:
    _finish(context, succeeded=True)


def pipeline_run_failed(context: Any) -> None:
    _finish(context, succeeded=False)
