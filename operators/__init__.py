"""Airflow operators for tideflow steps (imported as ``tideflow.operators``).

Operators are thin: they turn the Airflow context into a core call. Nothing
here imports torch, mlflow or boto3 at module level, so DAG parsing stays fast.
"""

from tideflow.operators.broker import GpuCapacitySensor, InferenceLoadSensor, RebalanceOperator
from tideflow.operators.data_prep import DataPrepOperator
from tideflow.operators.evaluation import EvaluationOperator
from tideflow.operators.gang_training import GangTrainingOperator
from tideflow.operators.promote import PromoteCheckpointOperator

__all__ = [
    "DataPrepOperator",
    "EvaluationOperator",
    "GangTrainingOperator",
    "GpuCapacitySensor",
    "InferenceLoadSensor",
    "PromoteCheckpointOperator",
    "RebalanceOperator",
]
