"""Where the page's numbers come from: MLflow (runs, champions) and the lease ledger.

Each source fails on its own: MLflow being down blanks the MLflow columns and
adds a line to the page's problems instead of failing the page.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tideflow.promotion.registry import METRIC_TAG, PREVIOUS_ALIAS
from tideflow.tracking.links import model_version_url, run_url
from tideflow.tracking.runs import TAG_DAG_ID, TAG_KIND, TAG_RUN_ID
from tideflow.ui.model import ChampionRow, LeaseRow, UsageRow
from tideflow.ui.timeline import BrokerPoint

RunKey = tuple[str, str]  # (dag_id, dag_run_id)


def _client() -> Any:
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    from mlflow.tracking import MlflowClient

    return MlflowClient()


def pipeline_mlflow_runs(dag_ids: set[str], limit: int = 200) -> dict[RunKey, tuple[str, str]]:
    """(dag_id, dag_run_id) -> (MLflow run address or "", run status) of the parent runs."""
    if not dag_ids:
        return {}
    client = _client()
    experiments = [e.experiment_id for e in client.search_experiments(max_results=1000)]
    if not experiments:
        return {}
    found: dict[RunKey, tuple[str, str]] = {}
    runs = client.search_runs(
        experiments,
        filter_string=f"tags.`{TAG_KIND}` = 'pipeline-run'",
        max_results=limit,
        order_by=["attributes.start_time DESC"],
    )
    for run in runs:
        dag_id = run.data.tags.get(TAG_DAG_ID)
        dag_run_id = run.data.tags.get(TAG_RUN_ID)
        if dag_id in dag_ids and dag_run_id and (dag_id, dag_run_id) not in found:
            url = run_url(run.info.experiment_id, run.info.run_id) or ""
            found[(dag_id, dag_run_id)] = (url, str(run.info.status))
    return found


def champions(alias: str = "champion") -> list[ChampionRow]:
    """Every registered model with a version behind ``alias``, and that version's lineage."""
    client = _client()
    rows = []
    for model in client.search_registered_models(max_results=1000):
        aliases = dict(getattr(model, "aliases", None) or {})
        if alias not in aliases:
            continue
        version = client.get_model_version(model.name, aliases[alias])
        tags = dict(version.tags or {})
        metrics = {
            key.removeprefix(METRIC_TAG): value
            for key, value in sorted(tags.items())
            if key.startswith(METRIC_TAG)
        }
        rows.append(
            ChampionRow(
                model=model.name,
                version=str(version.version),
                url=model_version_url(model.name, version.version),
                dag_id=tags.get("tideflow.dag_id"),
                dag_run_id=tags.get("tideflow.dag_run_id"),
                checkpoint=tags.get("tideflow.checkpoint"),
                metrics=metrics,
                previous_version=aliases.get(PREVIOUS_ALIAS),
                versions=len(client.search_model_versions(f"name = '{model.name}'")),
            )
        )
    return sorted(rows, key=lambda row: row.model)


def device_usage(ledger_path: Path, since: float, cluster_file: str | None) -> list[UsageRow]:
    """Device-hours per team and device class since ``since`` (epoch seconds)."""
    if not ledger_path.exists():
        return []
    from tideflow.gangs import open_ledger

    ledger = open_ledger(ledger_path, cluster_file)
    return [UsageRow(u.team, u.device_class, u.hours) for u in ledger.device_hours(since)]


def broker_timeline(journal_path: Path, since: float) -> list[BrokerPoint]:
    """The broker's decisions since ``since`` (epoch seconds), oldest first."""
    if not journal_path.exists():
        return []
    from tideflow.broker.journal import DecisionJournal

    return [
        BrokerPoint(
            e.at_s,
            e.total_gpus,
            e.inference_gpus,
            e.needed,
            e.wanted,
            len(e.preempted),
            e.action,
            e.reason,
        )
        for e in DecisionJournal(journal_path).since(since)
    ]


def current_leases(ledger_path: Path, cluster_file: str | None, now: float) -> list[LeaseRow]:
    if not ledger_path.exists():
        return []
    from tideflow.broker.local import INFERENCE_PREFIX
    from tideflow.gangs import open_ledger

    rows = []
    for lease in open_ledger(ledger_path, cluster_file).leases():
        purpose = (
            "inference"
            if lease.gang_id.startswith(INFERENCE_PREFIX)
            else "spare"
            if lease.priority < 0
            else "training"
        )
        rows.append(
            LeaseRow(
                lease.gang_id,
                lease.team,
                purpose,
                lease.device_class,
                sum(len(p.devices) for p in lease.placements),
                lease.priority,
                max(0.0, now - lease.acquired_at),
            )
        )
    return rows
