"""MLflow Model Registry moves for promotion, each safe to repeat.

A registered version is found again by the MLflow run of the promotion step
(one run per DAG run and step, itself found by tags), so a retried task or a
cleared-and-rerun promotion never registers a second version, and the alias is
moved only by the run that registered the version.
"""

from __future__ import annotations

import json
import time
from typing import Any

METRIC_TAG = "tideflow.metric."
PREVIOUS_ALIAS = "previous-champion"


def client() -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient()


def ensure_registered_model(mlflow: Any, name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        mlflow.get_registered_model(name)
    except MlflowException:
        try:
            mlflow.create_registered_model(name, tags={"tideflow.managed": "true"})
        except MlflowException:
            mlflow.get_registered_model(name)  # created concurrently: fine


def version_for_run(mlflow: Any, name: str, run_id: str) -> Any | None:
    from tideflow.tracking.runs import filter_literal

    found = mlflow.search_model_versions(
        f"name = {filter_literal(name)} and run_id = {filter_literal(run_id)}"
    )
    return min(found, key=lambda v: int(v.version)) if found else None


def champion(mlflow: Any, name: str, alias: str) -> tuple[Any, dict[str, float]] | None:
    from mlflow.exceptions import MlflowException

    try:
        version = mlflow.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None
    metrics = {
        k[len(METRIC_TAG) :]: float(v) for k, v in version.tags.items() if k.startswith(METRIC_TAG)
    }
    return version, metrics


def register(mlflow: Any, name: str, source: str, run_id: str, tags: dict[str, str]) -> Any:
    """Create the version once; after a failed call, look again before retrying.

    ``source`` is the model URI the builder logged (``models:/m-...`` in
    MLflow 3); ``mlflow.register_model`` resolves it and links the version to
    the logged model and its run.
    """
    import mlflow as mlflow_module
    from mlflow.exceptions import MlflowException

    last: Exception | None = None
    for attempt in range(5):
        existing = version_for_run(mlflow, name, run_id)
        if existing is not None:
            return existing
        try:
            version = mlflow_module.register_model(source, name, tags=tags)
            return mlflow.get_model_version(name, version.version)
        except MlflowException as exc:  # e.g. two writers raced for the next version number
            last = exc
            time.sleep(0.5 * (attempt + 1))
    raise RuntimeError(f"could not register a version of {name} for run {run_id}: {last}")


def move_alias(mlflow: Any, name: str, alias: str, version: str) -> str | None:
    """Point ``alias`` at ``version``; the old holder keeps ``previous-champion``."""
    current = champion(mlflow, name, alias)
    previous = str(current[0].version) if current is not None else None
    if previous == version:
        return previous
    if previous is not None:
        mlflow.set_registered_model_alias(name, PREVIOUS_ALIAS, previous)
    mlflow.set_registered_model_alias(name, alias, version)
    return previous


def audit(mlflow: Any, name: str, record: dict[str, Any]) -> None:
    """Append a who/when/what/why record to the registered model's tags."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    key = f"tideflow.audit.{stamp}.{int(time.time_ns() % 1_000_000):06d}"
    mlflow.set_registered_model_tag(
        name, key, json.dumps(record, sort_keys=True, default=str)[:4900]
    )
