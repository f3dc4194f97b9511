"""The ``tideflow_broker`` DAG: every few minutes, sense the load, rebalance if needed.

Built only when the broker is configured (``TIDEFLOW_BROKER_LOAD``); without it
the DAG file defines nothing, so a plain install shows no broker DAG.
"""

from __future__ import annotations

import datetime as dt
import os

from airflow.sdk import DAG

from tideflow.broker.service import BROKER_DAG_ID
from tideflow.broker.settings import BrokerSettings
from tideflow.operators.broker import InferenceLoadSensor, RebalanceOperator

__all__ = ["BROKER_DAG_ID", "broker_dag"]


def broker_dag(schedule: str = "*/5 * * * *") -> DAG | None:
    """The broker DAG, or None when no broker is configured.

    ``TIDEFLOW_BROKER_SENSE_S`` (default 240) bounds how long one run's sensor
    waits for a reason to act; ``TIDEFLOW_BROKER_POLL_S`` (default 30) is how
    often it looks.
    """
    if BrokerSettings.from_env() is None:
        return None
    sense_s = float(os.environ.get("TIDEFLOW_BROKER_SENSE_S", "240"))
    poll_s = float(os.environ.get("TIDEFLOW_BROKER_POLL_S", "30"))
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
