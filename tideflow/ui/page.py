"""The tideflow page as one self-contained HTML document (no scripts, no build step)."""

from __future__ import annotations

from collections import defaultdict
from html import escape
from urllib.parse import quote

from tideflow.ui.model import (
    ChampionRow,
    JournalRow,
    LeaseRow,
    Overview,
    PipelineRow,
    QueueRow,
    UsageRow,
)
from tideflow.ui.timeline import render_timeline

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
       color: #1f2933; background: #f5f7fa; }
header { background: #0b3954; color: #fff; padding: 14px 24px; }
header h1 { margin: 0; font-size: 20px; font-weight: 600; }
header p { margin: 4px 0 0; font-size: 13px; opacity: .8; }
main { padding: 16px 24px; display: grid; gap: 16px; }
section { background: #fff; border: 1px solid #d9e2ec; border-radius: 6px; padding: 12px 16px; }
h2 { font-size: 16px; margin: 0 0 8px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid #e4e7eb;
         vertical-align: top; }
th { color: #52606d; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.state { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; }
.success { background: #c6f7e2; color: #014d40; } .failed { background: #ffe3e3; color: #610404; }
.running, .queued { background: #e0e8f9; color: #19216c; }
.other { background: #e4e7eb; color: #323f4b; }
.muted { color: #7b8794; } .problem { color: #8a041a; }
.over { color: #8a041a; font-weight: 600; }
.legend { font-size: 12px; color: #52606d; margin: 4px 0 8px; }
a { color: #0b69a3; text-decoration: none; } a:hover { text-decoration: underline; }
code { font-size: 12px; }
"""


def _link(url: str | None, text: str) -> str:
    if not url:
        return escape(text)
    return f'<a href="{escape(url)}" target="_top">{escape(text)}</a>'


def _number(value: str) -> str:
    try:
        return f"{float(value):.4g}"
    except ValueError:
        return escape(value)


def _state(state: str) -> str:
    css = state if state in ("success", "failed", "running", "queued") else "other"
    return f'<span class="state {css}">{escape(state)}</span>'


def _pipelines(rows: tuple[PipelineRow, ...]) -> str:
    if not rows:
        return '<p class="muted">No tideflow pipelines are visible to you.</p>'
    body = []
    for pipeline in rows:
        header = (
            f'<tr><td rowspan="{max(1, len(pipeline.runs))}"><b>{escape(pipeline.dag_id)}</b>'
            f'<br><span class="muted">team {escape(pipeline.team)}'
            f"{' · paused' if pipeline.paused else ''}</span></td>"
        )
        if not pipeline.runs:
            body.append(header + '<td colspan="5" class="muted">no runs yet</td></tr>')
            continue
        for index, run in enumerate(pipeline.runs):
            cells = (
                f"<td>{_link(run.airflow_url, run.run_id)}</td><td>{_state(run.state)}</td>"
                f"<td>{escape(run.started or '')}</td><td>{escape(run.ended or '')}</td>"
                f"<td>{_link(run.mlflow_url, run.mlflow_status or '') if run.mlflow_status else ''}"
                "</td></tr>"
            )
            body.append((header if index == 0 else "<tr>") + cells)
    return (
        "<table><tr><th>pipeline</th><th>DAG run</th><th>state</th><th>started (UTC)</th>"
        "<th>ended (UTC)</th><th>MLflow run</th></tr>" + "".join(body) + "</table>"
    )


def _champions(rows: tuple[ChampionRow, ...]) -> str:
    if not rows:
        return '<p class="muted">No model has a champion yet.</p>'
    body = []
    for row in rows:
        metrics = ", ".join(f"{escape(k)} {_number(v)}" for k, v in row.metrics.items())
        run_page = (
            f"/dags/{quote(row.dag_id)}/runs/{quote(row.dag_run_id, safe='')}"
            if row.dag_id and row.dag_run_id
            else None
        )
        body.append(
            f"<tr><td><b>{escape(row.model)}</b></td>"
            f"<td>{_link(row.url, 'version ' + row.version)}</td>"
            f"<td>{escape(row.previous_version or '-')}</td><td class='num'>{row.versions}</td>"
            f"<td>{metrics}</td><td>{_link(run_page, row.dag_run_id or '')}</td>"
            f"<td><code>{escape(row.checkpoint or '')}</code></td></tr>"
        )
    return (
        "<table><tr><th>model</th><th>champion</th><th>previous</th><th>versions</th>"
        "<th>metrics</th><th>from DAG run</th><th>checkpoint</th></tr>" + "".join(body) + "</table>"
    )


def _usage(rows: tuple[UsageRow, ...], days: int) -> str:
    if not rows:
        return f'<p class="muted">No devices were leased in the last {days} days.</p>'
    classes = sorted({row.device_class for row in rows}, key=lambda c: (c != "gpu", c))
    by_team: dict[str, dict[str, float]] = defaultdict(dict)
    for row in rows:
        by_team[row.team][row.device_class] = row.hours
    head = "".join(f"<th>{escape(c.upper())}-hours</th>" for c in classes)
    body = "".join(
        f"<tr><td>{escape(team)}</td>"
        + "".join(f"<td class='num'>{hours.get(c, 0.0):.2f}</td>" for c in classes)
        + "</tr>"
        for team, hours in sorted(by_team.items())
    )
    return f"<table><tr><th>team</th>{head}</tr>{body}</table>"


def _broker(overview: Overview) -> str:
    if not overview.broker_shown:
        return (
            '<p class="muted">The GPU broker is not shown to you: it needs Airflow\'s '
            "permission to read the <code>tideflow-broker</code> view.</p>"
        )
    if overview.broker_window is None:
        return '<p class="muted">No broker is configured (TIDEFLOW_BROKER_LOAD).</p>'
    start, end = overview.broker_window
    recent = "".join(
        f"<tr><td>{escape(_clock(p.at_s))}</td><td>{escape(p.action)}</td>"
        f"<td class='num'>{p.inference_gpus}/{p.total_gpus}</td><td>{escape(p.reason)}</td></tr>"
        for p in reversed(overview.broker[-5:])
    )
    table = (
        "<table><tr><th>at (UTC)</th><th>action</th><th>inference GPUs</th><th>why</th></tr>"
        + recent
        + "</table>"
        if recent
        else ""
    )
    return render_timeline(overview.broker, start, end) + table


def _since(overview: Overview) -> str:
    if overview.broker_window is None:
        return ""
    return f", since {_clock(overview.broker_window[0])} UTC"


def _clock(at_s: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(at_s, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _leases(rows: tuple[LeaseRow, ...]) -> str:
    if not rows:
        return '<p class="muted">No devices are leased right now.</p>'
    body = "".join(
        f"<tr><td>{escape(r.gang_id)}</td><td>{escape(r.purpose)}</td><td>{escape(r.team)}</td>"
        f"<td class='num'>{r.devices} {escape(r.device_class.upper())}</td>"
        f"<td class='num'>{r.priority}</td><td class='num'>{r.held_s / 60:.0f} min</td></tr>"
        for r in rows
    )
    return (
        "<table><tr><th>gang</th><th>purpose</th><th>team</th><th>devices</th>"
        "<th>priority</th><th>held for</th></tr>" + body + "</table>"
    )


def _hours(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _teams(overview: Overview) -> str:
    if not overview.teams_declared:
        return (
            '<p class="muted">The cluster file declares no teams: one shared pool, no quotas.</p>'
        )
    if not overview.teams:
        return '<p class="muted">No team\'s quota is visible to you.</p>'
    body = []
    rows = overview.teams
    for index, row in enumerate(rows):
        cells = (
            f"<td>{escape(row.device)}</td><td class='num'>{row.nominal}</td>"
            f"<td class='num'>{row.in_use}</td><td class='num'>{row.borrowed}</td>"
            f"<td class='num'>{row.lent}</td>"
        )
        group = (row.team, row.device_class)
        first = index == 0 or (rows[index - 1].team, rows[index - 1].device_class) != group
        if first:  # the month's hours and budget are per device class: one cell for all
            span = sum(1 for r in rows[index:] if (r.team, r.device_class) == group)
            used = "-"
            if row.budget_hours:
                share = row.month_hours / row.budget_hours
                css = "num over" if share > 1 else "num"
                used = f"<span class='{css}'>{share:.0%}</span>"
            cells += (
                f"<td class='num' rowspan='{span}'>{_hours(row.month_hours)}</td>"
                f"<td class='num' rowspan='{span}'>{_hours(row.budget_hours)}</td>"
                f"<td class='num' rowspan='{span}'>{used}</td>"
            )
        body.append(f"<tr><td>{escape(row.team)}</td>{cells}</tr>")
    month = escape(overview.budget_month)
    return (
        "<table><tr><th>team</th><th>device</th><th>quota</th><th>in use</th>"
        "<th>borrowed</th><th>lent</th>"
        f"<th>device-hours {month}</th><th>budget</th><th>of budget</th></tr>"
        + "".join(body)
        + "</table><p class='legend'>borrowed: devices it uses beyond its quota; lent: "
        "devices of its quota other teams use now. Device-hours and budgets per calendar "
        "month (UTC), per device class; budgets are shown, not enforced.</p>"
    )


def _wait(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def _queue(rows: tuple[QueueRow, ...]) -> str:
    if not rows:
        return '<p class="muted">No gang is waiting for devices.</p>'
    body = "".join(
        f"<tr><td>{escape(r.gang_id)}</td><td>{escape(r.team)}</td>"
        f"<td>{escape(r.priority_class or '-')} <span class='muted'>({r.priority})</span></td>"
        f"<td class='num'>{r.devices} {escape(r.device.upper())}</td>"
        f"<td class='num'>{_wait(r.waited_s)}</td><td>{escape(r.reason)}</td></tr>"
        for r in rows
    )
    return (
        "<table><tr><th>gang</th><th>team</th><th>priority class</th><th>devices</th>"
        "<th>waiting for</th><th>why it waits</th></tr>" + body + "</table>"
    )


_ACTIONS = {
    "evict": "asked to stop",
    "preempted": "stopped after its checkpoint",
    "forced": "stopped, work lost",
}


def _preemptions(rows: tuple[JournalRow, ...], days: int) -> str:
    if not rows:
        return f'<p class="muted">No gang was asked to stop in the last {days} days.</p>'
    body = "".join(
        f"<tr><td>{escape(r.at)}</td><td>{escape(r.gang_id)}</td><td>{escape(r.team)}</td>"
        f"<td>{escape(_ACTIONS.get(r.action, r.action))}</td><td>{escape(r.reason)}</td></tr>"
        for r in rows
    )
    return (
        "<table><tr><th>at (UTC)</th><th>gang</th><th>team</th><th>what</th><th>why</th></tr>"
        + body
        + "</table>"
    )


def render_page(overview: Overview) -> str:
    problems = "".join(f'<p class="problem">{escape(p)}</p>' for p in overview.problems)
    mlflow = _link(overview.mlflow_url, "MLflow") if overview.mlflow_url else "MLflow"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tideflow</title>
<style>{_STYLE}</style></head>
<body>
<header><h1>tideflow</h1>
<p>Pipelines, their runs, champions in the {mlflow} registry, teams' quotas, the queue
and device use per team ·
generated {escape(overview.generated_at)} UTC</p></header>
<main>
{problems}
<section id="pipelines"><h2>Pipelines and recent runs</h2>{_pipelines(overview.pipelines)}</section>
<section id="champions"><h2>Champions</h2>{_champions(overview.champions)}</section>
<section id="teams"><h2>Teams: quotas and use</h2>{_teams(overview)}</section>
<section id="queue"><h2>Queue</h2>{_queue(overview.queue)}</section>
<section id="preemptions"><h2>Preemptions, last {overview.usage_window_days} days</h2>
{_preemptions(overview.preemptions, overview.usage_window_days)}</section>
<section id="usage"><h2>Device-hours per team, last {overview.usage_window_days} days</h2>
{_usage(overview.usage, overview.usage_window_days)}</section>
<section id="broker"><h2>GPU broker{_since(overview)}</h2>{_broker(overview)}</section>
<section id="leases"><h2>Leases now</h2>{_leases(overview.leases)}</section>
</main></body></html>
"""
