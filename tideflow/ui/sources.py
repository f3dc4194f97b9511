"""Where the page's numbers come from: MLflow (runs, champions) and the lease ledger.

Each source fails on its own: MLflow being down blanks the MLflow columns and
adds a line to the page's problems instead of failing the page; one champion
that cannot be read is left out with a problem line, the others still show.
Every source that returns rows of DAGs or teams takes the ``Viewer`` and
returns only what it may see (``tideflow.ui.access`` says who sees what).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from tideflow.promotion.registry import METRIC_TAG, PREVIOUS_ALIAS
from tideflow.tracking.links import model_version_url, run_url
from tideflow.tracking.runs import TAG_DAG_ID, TAG_KIND, TAG_RUN_ID, filter_literal
from tideflow.ui.access import Viewer, may_see_dag, may_see_lease, may_see_team, redact
from tideflow.ui.model import ChampionRow, JournalRow, LeaseRow, QueueRow, TeamRow, UsageRow
from tideflow.ui.timeline import BrokerPoint

log = logging.getLogger(__name__)

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
        filter_string=f"tags.`{TAG_KIND}` = {filter_literal('pipeline-run')}",
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


def champions(*, viewer: Viewer, alias: str = "champion") -> tuple[list[ChampionRow], list[str]]:
    """The champions ``viewer`` may see (their version's lineage DAG is readable), and problems.

    Every registered model with a version behind ``alias`` is read on its own:
    one that fails is left out with a problem line. The line names the model
    only when the viewer may read the DAG it came from; a model whose version
    could not even be read (its DAG unknown) is only counted.
    """
    client = _client()
    rows, problems, unnamed = [], [], 0
    for model in client.search_registered_models(max_results=1000):
        aliases = dict(getattr(model, "aliases", None) or {})
        if alias not in aliases:
            continue
        try:
            version = client.get_model_version(model.name, aliases[alias])
            tags = dict(version.tags or {})
        except Exception:
            log.warning("the %s of model %r could not be read", alias, model.name, exc_info=True)
            unnamed += 1
            continue
        if not may_see_dag(viewer, tags.get(TAG_DAG_ID)):
            continue
        try:
            rows.append(_champion(client, model.name, version, tags, aliases))
        except Exception as exc:
            log.warning("the %s of model %r could not be read", alias, model.name, exc_info=True)
            problems.append(f"the {alias} of model {model.name} could not be read: {exc}")
    if unnamed:
        problems.append(
            f"the {alias} of {unnamed} registered model(s) could not be read "
            "(the API server's log names them)"
        )
    return sorted(rows, key=lambda row: row.model), problems


def _champion(
    client: Any, name: str, version: Any, tags: dict[str, str], aliases: dict[str, str]
) -> ChampionRow:
    metrics = {
        key.removeprefix(METRIC_TAG): value
        for key, value in sorted(tags.items())
        if key.startswith(METRIC_TAG)
    }
    return ChampionRow(
        model=name,
        version=str(version.version),
        url=model_version_url(name, version.version),
        dag_id=tags.get(TAG_DAG_ID),
        dag_run_id=tags.get(TAG_RUN_ID),
        checkpoint=tags.get("tideflow.checkpoint"),
        metrics=metrics,
        previous_version=aliases.get(PREVIOUS_ALIAS),
        versions=len(client.search_model_versions(f"name = {filter_literal(name)}")),
    )


def device_usage(
    ledger_path: Path, since: float, cluster_file: str | None, *, viewer: Viewer
) -> list[UsageRow]:
    """Device-hours per team and device class since ``since`` (epoch seconds), of the
    teams ``viewer`` may see."""
    if not ledger_path.exists():
        return []
    from tideflow.gangs import open_ledger

    ledger = open_ledger(ledger_path, cluster_file)
    return [
        UsageRow(u.team, u.device_class, u.hours)
        for u in ledger.device_hours(since)
        if may_see_team(viewer, u.team)
    ]


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


def current_leases(
    ledger_path: Path, cluster_file: str | None, now: float, *, viewer: Viewer
) -> list[LeaseRow]:
    """The leases held now that ``viewer`` may see."""
    if not ledger_path.exists():
        return []
    from tideflow.broker.local import INFERENCE_PREFIX
    from tideflow.gangs import open_ledger

    rows = []
    for lease in open_ledger(ledger_path, cluster_file).leases():
        if not may_see_lease(viewer, lease.gang_id):
            continue
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


def team_quotas(
    ledger_path: Path, cluster_file: str | None, now: float, *, viewer: Viewer
) -> tuple[list[TeamRow], bool]:
    """Per team and quota entry: quota, in use, borrowed and lent now, and the calendar
    month's device-hours against the team's budget; only the teams ``viewer`` may see.
    Also whether the cluster file declares teams at all."""
    from tideflow.inventory import inventory_for
    from tideflow.scheduling.accounting import budgets, month_window, team_view
    from tideflow.scheduling.quota import Teams

    inventory = inventory_for(cluster_file)
    teams = Teams.of(inventory)
    if teams is None or not teams.teams:
        return [], False
    leases, spans = [], []
    if ledger_path.exists():  # no ledger yet: the quotas, nothing used
        from tideflow.gangs import open_ledger

        ledger = open_ledger(ledger_path, cluster_file)
        leases = ledger.leases()
        spans = ledger.usage_spans(month_window(now)[0], now)
    month: dict[tuple[str, str], float] = {}
    for span in spans:
        month[(span.team, span.device_class)] = (
            month.get((span.team, span.device_class), 0.0) + span.device_hours
        )
    planned = {(b.team, b.device_class): b.budget_hours for b in budgets(inventory.teams, [])}
    rows = [
        TeamRow(
            r.team,
            r.label,
            r.device_class,
            r.nominal,
            r.in_use,
            r.borrowed,
            r.lent,
            month.get((r.team, r.device_class), 0.0),
            planned.get((r.team, r.device_class)),
        )
        for r in team_view(teams, leases)
    ]
    have = {(r.team, r.device_class) for r in rows}
    for team, device_class in sorted(month):  # used a class it has no quota entry for
        if teams.governs(team) and (team, device_class) not in have:
            hours = month[(team, device_class)]
            rows.append(TeamRow(team, device_class, device_class, 0, 0, 0, 0, hours, None))
    rows.sort(key=lambda r: (r.team, r.device_class, r.device != r.device_class, r.device))
    return [r for r in rows if may_see_team(viewer, r.team)], True


def gang_queue(
    ledger_path: Path, cluster_file: str | None, now: float, *, viewer: Viewer
) -> list[QueueRow]:
    """The gangs waiting for devices that ``viewer`` may see, first in line first, each
    with the ledger's reason (other gangs in it redacted as ``tideflow.ui.access`` says)."""
    if not ledger_path.exists():
        return []
    from tideflow.gangs import open_ledger

    ledger = open_ledger(ledger_path, cluster_file)
    reasons = ledger.waiting_reasons()
    return [
        QueueRow(
            request.gang_id,
            request.team,
            request.priority_class,
            request.priority,
            request.devices,
            request.label(),
            max(0.0, now - since),
            redact(reasons.get(request.gang_id, ""), viewer),
        )
        for request, since in ledger.waiting()
        if may_see_lease(viewer, request.gang_id)
    ]


PREEMPTION_ACTIONS = ("evict", "preempted", "forced")
JOURNAL_SCAN = 5000  # preemption rows read (the viewer may see only some of them)
JOURNAL_SHOWN = 50


def preemption_journal(
    ledger_path: Path, cluster_file: str | None, since: float, *, viewer: Viewer
) -> list[JournalRow]:
    """Gangs asked to stop, and how they stopped, since ``since``, newest first."""
    if not ledger_path.exists():
        return []
    import datetime as dt

    from tideflow.gangs import open_ledger

    ledger = open_ledger(ledger_path, cluster_file)
    entries = [
        e
        for e in ledger.journal(since, JOURNAL_SCAN, actions=PREEMPTION_ACTIONS)
        if may_see_lease(viewer, e.gang_id)
    ]
    return [
        JournalRow(
            dt.datetime.fromtimestamp(e.at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S"),
            e.gang_id,
            e.team,
            e.action,
            redact(e.reason, viewer),
        )
        for e in reversed(entries[-JOURNAL_SHOWN:])
    ]
