"""Extra links on tideflow tasks: from a task in the Airflow UI to its MLflow run."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperatorLink

# The step's operator pushes the run's address under this key when it starts tracking.
MLFLOW_RUN_URL_KEY = "mlflow_run_url"


class MlflowRunLink(BaseOperatorLink):
    """The task's nested MLflow run (params, metrics, checkpoints, lineage)."""

    name = "MLflow run"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        # Called by the worker as the task finishes; Airflow stores the answer
        # as an XCom that the UI reads, so the API server never calls MLflow.
        from airflow.sdk.execution_time.xcom import XCom

        return str(XCom.get_value(ti_key=ti_key, key=MLFLOW_RUN_URL_KEY) or "")
