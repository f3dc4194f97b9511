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

        # A step whose tracking store has no web page (SQLite, as `tideflow run`
        # uses) pushes no address. Getting a missing XCom answers None but the API
        # client logs "XCom not found" as an error first, on every such run; asking
        # for all of the key's values answers an empty list without one.
        where = {"dag_id": ti_key.dag_id, "task_id": ti_key.task_id, "run_id": ti_key.run_id}
        if not XCom.get_all(key=MLFLOW_RUN_URL_KEY, **where):
            return ""
        return str(XCom.get_value(ti_key=ti_key, key=MLFLOW_RUN_URL_KEY) or "")
