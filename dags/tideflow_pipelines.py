"""Airflow DAG file: one DAG per pipeline file under $TIDEFLOW_PIPELINES_DIR.

The directory defaults to pipelines/. This file stays thin on purpose: it
imports no torch, mlflow or boto3 and touches no network. A broken pipeline
file shows as an Airflow import error naming that file and line.
"""

from tideflow.dag.loader import register

register(globals())
