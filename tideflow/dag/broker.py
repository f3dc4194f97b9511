"""The ``tideflow_broker`` DAG: every few minutes, sense the load, rebalance if needed.

Built only when the broker is configured (``TIDEFLOW_BROKER_LOAD``); without it
the DAG file defines nothing, so a plain install shows no broker DAG.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from tideflow import settings_registry as registry
from tideflow.broker.settings import BROKER_DAG_ID, BrokerSettings
from tideflow.config import ConfigError, Settings
from tideflow.operators.broker import InferenceLoadSensor, RebalanceOperator

__all__ = ["BROKER_DAG_ID", "broker_dag"]


def broker_dag(schedule: str = "*/5 * * * *", dag_file: str = "tideflow_broker.py") -> DAG | None:
    """The broker DAG, or None when no broker is configured.

    ``TIDEFLOW_BROKER_SENSE_S`` (default 240) bounds how long one run's sensor
    waits for a reason to act; ``TIDEFLOW_BROKER_POLL_S`` (default 30) is how
    often it looks.
    """
    try:
        if BrokerSettings.from_env() is None:
            return None
        registry.check_set("dag")
        sense_s = registry.number("TIDEFLOW_BROKER_SENSE_S")
        poll_s = registry.number("TIDEFLOW_BROKER_POLL_S")
        Settings.from_env()  # its journal's home, read by the tasks
    except ConfigError as exc:  # the DAG file's import error: the message, no traceback
        from tideflow.dag.loader import report_setting_error  # the pipelines' loader: 80 ms

        report_setting_error(dag_file, exc)
        return None
    with DAG(
        dag_id=BROKER_DAG_ID,
        description="Shift GPUs between inference and training by load (tideflow broker)",
        schedule=schedule,
        start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        catchup=False,
        max_active_runs=1,
        tags=["tideflow", "team:platform", "broker"],
        doc_md=(
            "The load sensor waits (deferred, in the triggerer) until the measured or "
            "forecast inference load asks for a change; the rebalance step then applies "
            "it: reclaimed gangs checkpoint before they are evicted. Every decision and "
            "its reason is in the broker journal and on the tideflow page."
        ),
    ) as dag:
        sense = InferenceLoadSensor(task_id="sense-load", timeout=sense_s, poll_s=poll_s)
        rebalance = RebalanceOperator(task_id="rebalance")
        sense >> rebalance
    return dag
