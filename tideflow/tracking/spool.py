"""Metrics a training run could not deliver to MLflow, kept in a spool file until they can be.

The worker's ``tideflow.runtime.MetricsLogger`` writes the spool while MLflow is
unreachable; the operator that closes the gang's step (an Airflow task, which
imports no torch) delivers what is left with ``flush_spool``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tideflow import settings_registry as registry


def spool_path(run_id: str) -> Path:
    home = Path(registry.optional_path("TIDEFLOW_HOME") or Path.cwd() / ".tideflow")
    return home / "mlflow-spool" / f"{run_id}.jsonl"


def deliver(run_id: str, records: list[dict[str, Any]]) -> None:
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    metrics = [
        Metric(r["key"], float(r["value"]), int(r["ts"]), int(r["step"]))
        for r in records
        if r["kind"] == "metric"
    ]
    params = [Param(r["key"], str(r["value"])) for r in records if r["kind"] == "param"]
    tags = [RunTag(r["key"], str(r["value"])) for r in records if r["kind"] == "tag"]
    for start in range(0, max(len(metrics), 1), 900):  # MLflow caps a batch at 1000 items
        client.log_batch(
            run_id,
            metrics=metrics[start : start + 900],
            params=params if start == 0 else [],
            tags=tags if start == 0 else [],
        )


def flush_spool(run_id: str) -> int:
    """Deliver what a training run could not; returns the number of records delivered."""
    path = spool_path(run_id)
    if not path.exists():
        return 0
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if records:
        deliver(run_id, records)
    path.unlink()
    return len(records)
