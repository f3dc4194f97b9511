"""The broker timeline as an inline SVG: allocation, need and forecast, preemptions.

Drawn on the server, no scripts: inference GPUs (a step line), the training
GPUs left to gangs (shaded), the GPUs the measured load needed and the GPUs
the forecast wanted, and a red mark where gangs were preempted.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape


@dataclass(frozen=True)
class BrokerPoint:
    at_s: float
    total_gpus: int
    inference_gpus: int
    needed: int | None  # GPUs the measured load needed (None: data gap)
    wanted: int | None  # GPUs the forecast wanted
    preempted: int
    action: str
    reason: str


WIDTH, HEIGHT = 960, 260
LEFT, RIGHT, TOP, BOTTOM = 48, 16, 16, 32


def _x(t: float, start: float, end: float) -> float:
    return LEFT + (t - start) / max(end - start, 1.0) * (WIDTH - LEFT - RIGHT)


def _y(gpus: float, total: int) -> float:
    return TOP + (1 - gpus / max(total, 1)) * (HEIGHT - TOP - BOTTOM)


def _steps(points: Sequence[tuple[float, float]], start: float, end: float, total: int) -> str:
    path = []
    for index, (t, value) in enumerate(points):
        x, y = _x(t, start, end), _y(value, total)
        if index == 0:
            path.append(f"M{x:.1f},{y:.1f}")
        else:
            path.append(f"H{x:.1f}V{y:.1f}")
    if points:
        path.append(f"H{_x(end, start, end):.1f}")
    return " ".join(path)


def _line(
    points: Sequence[tuple[float, float | None]], start: float, end: float, total: int
) -> str:
    path, pen_down = [], False
    for t, value in points:
        if value is None:  # a data gap breaks the line
            pen_down = False
            continue
        x, y = _x(t, start, end), _y(value, total)
        path.append(f"{'L' if pen_down else 'M'}{x:.1f},{y:.1f}")
        pen_down = True
    return " ".join(path)


def render_timeline(points: Sequence[BrokerPoint], start_s: float, end_s: float) -> str:
    if not points:
        return '<p class="muted">The broker has made no decision in this window.</p>'
    total = max(p.total_gpus for p in points)
    alloc = [(p.at_s, float(p.inference_gpus)) for p in points]
    training_area = (
        _steps(alloc, start_s, end_s, total)
        + f" V{_y(total, total):.1f} H{_x(points[0].at_s, start_s, end_s):.1f} Z"
    )
    grid = []
    for fraction in (0, 0.25, 0.5, 0.75, 1):
        gpus = round(total * fraction)
        y = _y(gpus, total)
        grid.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{gpus}</text>'
        )
    for index in range(5):
        t = start_s + (end_s - start_s) * index / 4
        label = dt.datetime.fromtimestamp(t, dt.UTC).strftime("%H:%M")
        grid.append(
            f'<text x="{_x(t, start_s, end_s):.1f}" y="{HEIGHT - 10}" '
            f'text-anchor="middle">{label}</text>'
        )
    marks = "".join(
        f'<path d="M{_x(p.at_s, start_s, end_s):.1f},{TOP + 2} l-5,-9 h10 z" class="preempt">'
        f"<title>{escape(p.reason)}</title></path>"
        for p in points
        if p.preempted
    )
    return f"""<svg viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" role="img"
 aria-label="broker timeline" class="timeline" style="max-width: 960px">
<style>
.timeline text {{ font-size: 11px; fill: #52606d; }}
.timeline .grid {{ stroke: #e4e7eb; }}
.timeline .training {{ fill: #c6f7e2; }}
.timeline .inference {{ fill: none; stroke: #0b69a3; stroke-width: 2; }}
.timeline .needed {{ fill: none; stroke: #e12d39; stroke-width: 1.2; }}
.timeline .wanted {{ fill: none; stroke: #f0b429; stroke-width: 1.2; stroke-dasharray: 4 3; }}
.timeline .preempt {{ fill: #e12d39; }}
</style>
{"".join(grid)}
<path d="{training_area}" class="training"><title>GPUs left to training</title></path>
<path d="{_steps(alloc, start_s, end_s, total)}" class="inference">
<title>inference GPUs</title></path>
<path d="{_line([(p.at_s, p.needed) for p in points], start_s, end_s, total)}" class="needed">
<title>GPUs the measured load needed</title></path>
<path d="{_line([(p.at_s, p.wanted) for p in points], start_s, end_s, total)}" class="wanted">
<title>GPUs the forecast wanted</title></path>
{marks}
</svg>
<p class="legend"><span style="color:#0b69a3">━ inference GPUs</span> ·
<span style="background:#c6f7e2">&nbsp;training GPUs&nbsp;</span> ·
<span style="color:#e12d39">━ needed by the measured load</span> ·
<span style="color:#f0b429">╌ wanted by the forecast</span> ·
<span style="color:#e12d39">▼ gangs preempted (checkpoint first)</span></p>"""
