"""Airflow DAG file of the tideflow broker (defines nothing unless TIDEFLOW_BROKER_LOAD is set)."""

from tideflow.dag.broker import broker_dag

dag = broker_dag(dag_file=__file__)
