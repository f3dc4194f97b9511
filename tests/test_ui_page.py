"""The tideflow page's HTML from plain data (no servers): content, escaping, empty states."""

from __future__ import annotations

from tideflow.ui import ChampionRow, DagRunRow, Overview, PipelineRow, UsageRow, render_page


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
