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
from collections.abc import Callable
from typing import Any, TypeVar
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
    from tideflow.tracking import mlflow_ui_base

    problems: list[str] = []
    airflow_part, viewer = _airflow_part(user)
    mlflow_runs, model_rows = _mlflow_part(airflow_part, viewer, problems)
    settings = Settings.from_env()
    ledger, cluster, now = settings.ledger_path, settings.cluster, time.time()
    since = now - USAGE_WINDOW_DAYS * 86400

    def read(what: str, call: Callable[[], _R]) -> _R | None:
        # each part the page cannot read is one line on it; the rest still shows
        try:
            return call()
        except Exception as exc:
            problems.append(f"{what} could not be read: {exc}")
            return None

    usage = read("the lease ledger", lambda: device_usage(ledger, since, cluster, viewer=viewer))
    journal = settings.broker_journal_path
    broker = (
        read("the broker's state", lambda: broker_timeline(journal, now - 86400))
        if viewer.broker
        else None
    )
    leases = read("the leases", lambda: current_leases(ledger, cluster, now, viewer=viewer))
    quotas = read("the teams' quotas", lambda: team_quotas(ledger, cluster, now, viewer=viewer))
    teams, declared = quotas or ([], False)
    queue, preemptions = read(
        "the queue",
        lambda: (
            gang_queue(ledger, cluster, now, viewer=viewer),
            preemption_journal(ledger, cluster, since, viewer=viewer),
        ),
    ) or ([], [])
    return Overview(
        teams=tuple(teams),
        teams_declared=declared,
        budget_month=dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m"),
        queue=tuple(queue),
        preemptions=tuple(preemptions),
        generated_at=_when(dt.datetime.now(dt.UTC)) or "",
        broker=tuple(broker or ()),
        broker_window=_window(broker or [], now) if viewer.broker and journal.exists() else None,
        broker_shown=viewer.broker,
        leases=tuple(leases or ()),
        pipelines=_pipeline_rows(airflow_part, mlflow_runs),
        champions=tuple(model_rows),
        usage=tuple(usage or ()),
        usage_window_days=USAGE_WINDOW_DAYS,
        mlflow_url=mlflow_ui_base(),
        problems=tuple(problems),
    )


_R = TypeVar("_R")
_AirflowPart = list[tuple[Any, list[Any]]]  # _airflow_pipelines: each DAG with its runs


def _airflow_part(user: Any) -> tuple[_AirflowPart, Viewer]:
    """The pipelines ``user`` may see with their runs, and what else they may see."""
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
    return airflow_part, viewer


def _mlflow_part(
    airflow_part: _AirflowPart, viewer: Viewer, problems: list[str]
) -> tuple[dict[tuple[str, str], tuple[str, str]], list[ChampionRow]]:
    """The MLflow run of each pipeline run, and the registered models' champions."""
    from tideflow.tracking import tracking_enabled

    if not tracking_enabled():
        return {}, []
    runs: dict[tuple[str, str], tuple[str, str]] = {}
    try:
        runs = pipeline_mlflow_runs({dag[0] for dag, _ in airflow_part})
        model_rows, champion_problems = champions(viewer=viewer)
    except Exception as exc:  # the page still shows what Airflow knows
        problems.append(f"MLflow could not be read: {exc}")
        return runs, []
    problems.extend(champion_problems)
    return runs, model_rows


def _pipeline_rows(
    airflow_part: _AirflowPart, mlflow_runs: dict[tuple[str, str], tuple[str, str]]
) -> tuple[PipelineRow, ...]:
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
    return tuple(pipelines)


@app.get("/", response_class=HTMLResponse)
def page(user: GetUserDep) -> HTMLResponse:
    return HTMLResponse(render_page(build_overview(user)))


@app.get("/api/overview")
def overview(user: GetUserDep) -> dict[str, Any]:
    return build_overview(user).to_json()
