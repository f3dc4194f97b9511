"""The tideflow page as a FastAPI app mounted by Airflow's API server under ``/tideflow``.

Airflow does not put plugin apps behind its login, so every route here asks
Airflow's auth manager who the caller is (the UI's session cookie or a bearer
token; none, or an invalid or expired one, is answered 401/403, and a browser
without a session is sent to Airflow's login page and back). Then it asks the
auth manager what that user may read and filters every panel by it:

* pipelines and their runs: the tideflow DAGs among ``get_authorized_dag_ids``;
* champions: those whose version's ``tideflow.dag_id`` tag names such a DAG
  (no tag: shown to nobody);
* leases now: a gang's lease when the DAG in its gang id
  (``dag_id/run_id/task_id``) is such a DAG; the broker's reservations when the
  user may see the broker; a lease tied to no DAG: shown to nobody;
* device-hours: a team's when the user may read one of its tideflow DAGs
  (``team:<team>`` tag); the broker's team ``inference`` when the user may see
  the broker;
* teams (quota, use, borrowed, lent, the month's device-hours against the
  budget): as device-hours; the queue and the preemption journal: a gang's row
  as its lease, and in their reasons the gangs the user may not see are
  replaced;
* GPU broker: when ``is_authorized_custom_view(method="GET",
  resource_name="tideflow-broker")`` is True.

``tideflow.ui.access`` holds these rules (and their table).
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any
from urllib.parse import quote

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from tideflow.ui import (
    BROKER_VIEW,
    ChampionRow,
    DagRunRow,
    Overview,
    PipelineRow,
    broker_timeline,
    champions,
    current_leases,
    device_usage,
    gang_queue,
    pipeline_mlflow_runs,
    preemption_journal,
    render_page,
    team_quotas,
)
from tideflow.ui.access import Viewer

URL_PREFIX = "/tideflow"
RUNS_PER_PIPELINE = 5
USAGE_WINDOW_DAYS = 7

app = FastAPI(title="tideflow", docs_url=None, redoc_url=None, openapi_url=None)


@app.exception_handler(HTTPException)
async def _to_login(request: Request, exc: HTTPException) -> Response:
    if exc.status_code == 401 and not request.url.path.startswith(f"{URL_PREFIX}/api/"):
        login = get_auth_manager().get_url_login(next_url=f"{URL_PREFIX}/")
        return RedirectResponse(login, status_code=303)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)


def _when(value: dt.datetime | None) -> str | None:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S") if value else None


def _airflow_pipelines(allowed: set[str]) -> list[tuple[Any, list[Any]]]:
    """The tideflow DAGs among ``allowed``, each with its most recent runs."""
    from airflow.models import DagModel, DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    found = []
    with create_session() as session:
        dags = session.scalars(
            select(DagModel)
            .where(DagModel.dag_id.in_(allowed), DagModel.is_stale.is_(False))
            .order_by(DagModel.dag_id)
        ).all()
        for dag in dags:
            tags = [tag.name for tag in dag.tags]
            if "tideflow" not in tags:
                continue
            runs = session.scalars(
                select(DagRun)
                .where(DagRun.dag_id == dag.dag_id)
                .order_by(DagRun.run_after.desc())
                .limit(RUNS_PER_PIPELINE)
            ).all()
            team = next((t.removeprefix("team:") for t in tags if t.startswith("team:")), "")
            found.append(
                (
                    (dag.dag_id, team, bool(dag.is_paused)),
                    [(r.run_id, str(r.state), r.start_date, r.end_date) for r in runs],
                )
            )
    return found


def _window(points: list[Any], now: float) -> tuple[float, float]:
    """The last 24 hours, or less when the broker started later (at least 10 minutes)."""
    start = now - 86400
    if points:
        start = max(start, points[0].at_s - 60)
    return min(start, now - 600), now


def build_overview(user: Any) -> Overview:
    from tideflow.config import Settings
    from tideflow.tracking import mlflow_ui_base, tracking_enabled

    problems = []
    auth = get_auth_manager()
    allowed = set(auth.get_authorized_dag_ids(user=user, method="GET"))
    airflow_part = _airflow_pipelines(allowed)
    viewer = Viewer(
        dag_ids=frozenset(allowed),
        teams=frozenset(team for (_, team, _), _ in airflow_part if team),
        broker=bool(
            auth.is_authorized_custom_view(method="GET", resource_name=BROKER_VIEW, user=user)
        ),
    )
    mlflow_runs: dict[tuple[str, str], tuple[str, str]] = {}
    model_rows: list[ChampionRow] = []
    if tracking_enabled():
        try:
            mlflow_runs = pipeline_mlflow_runs({dag[0] for dag, _ in airflow_part})
            model_rows, champion_problems = champions(viewer=viewer)
            problems.extend(champion_problems)
        except Exception as exc:  # the page still shows what Airflow knows
            problems.append(f"MLflow could not be read: {exc}")
    pipelines = []
    for (dag_id, team, paused), runs in airflow_part:
        rows = []
        for run_id, state, started, ended in runs:
            url, status = mlflow_runs.get((dag_id, run_id), (None, None))
            rows.append(
                DagRunRow(
                    run_id=run_id,
                    state=state,
                    started=_when(started),
                    ended=_when(ended),
                    airflow_url=f"/dags/{quote(dag_id)}/runs/{quote(run_id, safe='')}",
                    mlflow_url=url or None,
                    mlflow_status=status,
                )
            )
        pipelines.append(PipelineRow(dag_id, team, paused, tuple(rows)))
    settings = Settings.from_env()
    try:
        usage = device_usage(
            settings.ledger_path,
            time.time() - USAGE_WINDOW_DAYS * 86400,
            settings.cluster,
            viewer=viewer,
        )
    except Exception as exc:
        problems.append(f"the lease ledger could not be read: {exc}")
        usage = []
    now = time.time()
    journal = settings.broker_journal_path
    try:
        broker = broker_timeline(journal, now - 86400) if viewer.broker else []
    except Exception as exc:
        problems.append(f"the broker's state could not be read: {exc}")
        broker = []
    try:
        leases = current_leases(settings.ledger_path, settings.cluster, now, viewer=viewer)
    except Exception as exc:
        problems.append(f"the leases could not be read: {exc}")
        leases = []
    try:
        teams, declared = team_quotas(settings.ledger_path, settings.cluster, now, viewer=viewer)
    except Exception as exc:
        problems.append(f"the teams' quotas could not be read: {exc}")
        teams, declared = [], False
    try:
        queue = gang_queue(settings.ledger_path, settings.cluster, now, viewer=viewer)
        preemptions = preemption_journal(
            settings.ledger_path,
            settings.cluster,
            now - USAGE_WINDOW_DAYS * 86400,
            viewer=viewer,
        )
    except Exception as exc:
        problems.append(f"the queue could not be read: {exc}")
        queue, preemptions = [], []
    return Overview(
        teams=tuple(teams),
        teams_declared=declared,
        budget_month=dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m"),
        queue=tuple(queue),
        preemptions=tuple(preemptions),
        generated_at=_when(dt.datetime.now(dt.UTC)) or "",
        broker=tuple(broker),
        broker_window=_window(broker, now) if viewer.broker and journal.exists() else None,
        broker_shown=viewer.broker,
        leases=tuple(leases),
        pipelines=tuple(pipelines),
        champions=tuple(model_rows),
        usage=tuple(usage),
        usage_window_days=USAGE_WINDOW_DAYS,
        mlflow_url=mlflow_ui_base(),
        problems=tuple(problems),
    )


@app.get("/", response_class=HTMLResponse)
def page(user: GetUserDep) -> HTMLResponse:
    return HTMLResponse(render_page(build_overview(user)))


@app.get("/api/overview")
def overview(user: GetUserDep) -> dict[str, Any]:
    return build_overview(user).to_json()
