"""The tideflow page's HTML from plain data (no servers): content, escaping, empty states."""

from __future__ import annotations

from html import escape
from html.parser import HTMLParser
from urllib.parse import quote

import pytest

from tideflow.ui import (
    BrokerPoint,
    ChampionRow,
    DagRunRow,
    LeaseRow,
    Overview,
    PipelineRow,
    UsageRow,
    render_page,
)

# Ten payloads, each aimed at a different way out of the text (tests/test_ui_access.py
# puts them where a user can: MLflow model names, tag values, a lease's team).
XSS = (
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(2)>',
    "'><svg onload=alert(3)>",
    "</td></tr></table><script>alert(4)</script>",
    '<iframe src="javascript:alert(5)"></iframe>',
    '<a href="javascript:alert(6)">x</a>',
    "&lt;script&gt;alert(7)&lt;/script&gt;",
    "<!-- seven <b>8</b>",
    "</style><script>alert(9)</script>",
    '" onmouseover="alert(10)',
)


def overview(**changes: object) -> Overview:
    base = {
        "generated_at": "2026-11-23 06:00:00",
        "pipelines": (
            PipelineRow(
                "digits",
                "vision",
                False,
                (
                    DagRunRow(
                        "manual__<script>alert(1)</script>",
                        "failed",
                        "2026-11-23 05:00:00",
                        None,
                        "/dags/digits/runs/x",
                        "http://mlflow:5000/#/experiments/1/runs/abc",
                        "FAILED",
                    ),
                ),
            ),
        ),
        "champions": (
            ChampionRow(
                "digits-classifier",
                "3",
                "http://mlflow:5000/#/models/digits-classifier/versions/3",
                "digits",
                "manual__2026-11-23T05:38:10+00:00",
                "s3://tideflow/ckpt/MANIFEST.json",
                {"accuracy": "0.9638888835906982"},
                "2",
                3,
            ),
        ),
        "usage": (
            UsageRow("nlp", "cpu", 1.5),
            UsageRow("nlp", "gpu", 12.25),
            UsageRow("vision", "npu", 0.75),
        ),
        "usage_window_days": 7,
        "mlflow_url": "http://mlflow:5000",
    }
    base.update(changes)
    return Overview(**base)  # type: ignore[arg-type]


def test_page_shows_runs_champions_and_usage_with_text_escaped() -> None:
    html = render_page(overview())
    assert "<script>alert(1)</script>" not in html
    assert "manual__&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert '<span class="state failed">failed</span>' in html
    assert 'href="http://mlflow:5000/#/experiments/1/runs/abc"' in html
    assert "version 3" in html and "accuracy 0.9639" in html  # 4 significant digits
    assert 'href="/dags/digits/runs/manual__2026-11-23T05%3A38%3A10%2B00%3A00"' in html
    # GPU-hours come first; a team without a class shows 0.00
    header = html[html.index('id="usage"') :]
    assert header.index("GPU-hours") < header.index("CPU-hours") < header.index("NPU-hours")
    assert "<td>vision</td><td class='num'>0.00</td><td class='num'>0.00</td>" in html
    assert "<td class='num'>12.25</td>" in html


def test_page_says_what_is_missing_instead_of_failing() -> None:
    html = render_page(
        overview(
            pipelines=(),
            champions=(),
            usage=(),
            problems=("MLflow could not be read: connection refused",),
        )
    )
    assert "No tideflow pipelines are visible to you." in html
    assert "No model has a champion yet." in html
    assert "No devices were leased in the last 7 days." in html
    assert "MLflow could not be read: connection refused" in html


def test_broker_timeline_draws_allocation_need_gaps_and_preemptions() -> None:
    from tideflow.ui import BrokerPoint, render_timeline

    points = [
        BrokerPoint(0.0, 200, 120, 90, 110, 0, "hold", "fits"),
        BrokerPoint(600.0, 200, 136, None, 130, 0, "grow", "gap"),  # data gap in the need
        BrokerPoint(1200.0, 200, 152, 140, 150, 2, "grow", "emergency <now>"),
    ]
    svg = render_timeline(points, 0.0, 1800.0)
    assert svg.count('class="preempt"') == 1 and "emergency &lt;now&gt;" in svg
    needed = svg.split('class="needed"')[0].rsplit('<path d="', 1)[1]
    assert needed.count("M") == 2  # the gap breaks the "needed" line in two
    assert render_timeline([], 0.0, 1.0).startswith('<p class="muted">')
    page = render_page(overview(broker=tuple(points), broker_window=(0.0, 1800.0)))
    assert '<section id="broker">' in page and "<svg" in page and "emergency" in page
    assert "No broker is configured" in render_page(overview())


def _everywhere(text: str) -> Overview:
    """``text`` in every field a user can influence; links built as the page's sources do."""
    return Overview(
        generated_at="2026-11-23 06:00:00",
        pipelines=(
            PipelineRow(
                text,
                text,
                False,
                (
                    DagRunRow(
                        text,
                        text,
                        text,
                        text,
                        f"/dags/{quote(text)}/runs/{quote(text, safe='')}",
                        f"http://mlflow:5000/#/experiments/1/runs/{quote(text)}",
                        text,
                    ),
                ),
            ),
        ),
        champions=(
            ChampionRow(
                text,
                text,
                f"http://mlflow:5000/#/models/{quote(text, safe='')}/versions/1",
                text,
                text,
                text,
                {text: text},
                text,
                2,
            ),
        ),
        usage=(UsageRow(text, text, 1.5),),
        usage_window_days=7,
        mlflow_url="http://mlflow:5000",
        problems=(f"the champion of {text} could not be read",),
        broker=(BrokerPoint(0.0, 16, 8, 6, 8, 1, text, text),),
        broker_window=(0.0, 600.0),
        leases=(LeaseRow(text, text, text, text, 2, 0, 60.0),),
    )


def _elements(html: str) -> list[tuple[str, tuple[str, ...]]]:
    """Every element's tag and attribute names, in order."""
    found: list[tuple[str, tuple[str, ...]]] = []

    class Parser(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            found.append((tag, tuple(name for name, _ in attrs)))

        def handle_comment(self, data: str) -> None:
            found.append(("<!--", ()))

    Parser().feed(html)
    return found


@pytest.mark.parametrize("payload", XSS)
def test_a_payload_in_every_user_controlled_field_comes_out_as_text(payload: str) -> None:
    html = render_page(_everywhere(payload))
    assert payload not in html
    assert html.count(escape(payload)) >= 15  # shown, as text, in every panel
    # the same elements and attributes as with harmless text: nothing was injected
    assert _elements(html) == _elements(render_page(_everywhere("harmless")))


def test_page_says_the_broker_is_not_shown_to_this_user() -> None:
    html = render_page(overview(broker_shown=False))
    section = html[html.index('<section id="broker">') :]
    assert "not shown to you" in section and "No broker is configured" not in section


def test_who_sees_which_lease_and_team() -> None:
    from tideflow.ui.access import Viewer, dag_of_gang, may_see_lease, may_see_team

    assert dag_of_gang("digits/manual__2026-11-23T05:38:10+00:00/train") == "digits"
    for untied in ("broker/inference/0", "hand-made-gang", "digits/train", "digits//train", ""):
        assert dag_of_gang(untied) is None, untied
    reader = Viewer(dag_ids=frozenset({"digits"}), teams=frozenset({"vision"}), broker=False)
    operator = Viewer(dag_ids=frozenset(), teams=frozenset(), broker=True)
    assert may_see_lease(reader, "digits/manual__1/train")
    assert not may_see_lease(reader, "forecast/manual__1/train")
    assert not may_see_lease(reader, "broker/inference/0")
    assert may_see_lease(operator, "broker/inference/0")
    assert not may_see_lease(operator, "digits/manual__1/train")
    assert not may_see_lease(operator, "hand-made-gang")  # tied to nothing: nobody
    assert may_see_team(reader, "vision") and not may_see_team(reader, "nlp")
    assert not may_see_team(reader, "inference") and may_see_team(operator, "inference")
