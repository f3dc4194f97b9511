"""The tideflow page's HTML from plain data (no servers): content, escaping, empty states."""

from __future__ import annotations

import json
from dataclasses import asdict
from html import escape
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote

import pytest

from tideflow.ui import (
    BrokerPoint,
    ChampionRow,
    DagRunRow,
    JournalRow,
    LeaseRow,
    Overview,
    PipelineRow,
    QueueRow,
    TeamRow,
    UsageRow,
    render_page,
)

# Ten payloads, each aimed at a different way out of the text (tests/stack/test_ui_access.py
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
        teams=(TeamRow(text, text, text, 4, 2, 0, 1, 3.5, 10.0),),
        teams_declared=True,
        budget_month=text,
        queue=(QueueRow(text, text, text, 100, 2, text, 60.0, text),),
        preemptions=(JournalRow(text, text, text, text, text),),
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


# -- teams, queue and preemptions ---------------------------------------------------------


def test_teams_queue_and_preemptions_sections() -> None:
    html = render_page(
        overview(
            teams_declared=True,
            budget_month="2026-11",
            teams=(
                TeamRow("risk", "gpu", "gpu", 4, 6, 2, 0, 11.0, 10.0),
                TeamRow("risk", "H100 gpu", "gpu", 2, 0, 0, 0, 11.0, 10.0),
                TeamRow("marketing", "gpu", "gpu", 4, 0, 0, 2, 12.0, None),
            ),
            queue=(
                QueueRow(
                    "ads/run1/train",
                    "marketing",
                    "normal",
                    100,
                    4,
                    "gpu",
                    600.0,
                    "stopping fraud/run1/train (checkpoint first) to make room",
                ),
            ),
            preemptions=(
                JournalRow("2026-11-02 01:30:00", "fraud/run1/train", "risk", "forced", "lost"),
                JournalRow("2026-11-02 01:30:00", "fraud/run1/train", "risk", "evict", "why"),
            ),
        )
    )
    teams = html[html.index('<section id="teams">') : html.index('<section id="queue">')]
    # one cell for the month's hours and budget of risk's GPUs, over its two quota rows
    assert (
        "<tr><td>risk</td><td>gpu</td><td class='num'>4</td><td class='num'>6</td>"
        "<td class='num'>2</td><td class='num'>0</td><td class='num' rowspan='2'>11.0</td>"
        "<td class='num' rowspan='2'>10.0</td><td class='num' rowspan='2'>"
        "<span class='num over'>110%</span></td></tr>"
        "<tr><td>risk</td><td>H100 gpu</td><td class='num'>2</td><td class='num'>0</td>"
        "<td class='num'>0</td><td class='num'>0</td></tr>"
    ) in teams
    assert "<th>device-hours 2026-11</th>" in teams
    assert "<td class='num' rowspan='1'>12.0</td><td class='num' rowspan='1'>-</td>" in teams
    queue = html[html.index('<section id="queue">') : html.index('<section id="preemptions">')]
    assert "<td>normal <span class='muted'>(100)</span></td>" in queue
    assert "<td class='num'>4 GPU</td><td class='num'>10 min</td>" in queue
    assert "stopping fraud/run1/train (checkpoint first) to make room" in queue
    journal = html[html.index('<section id="preemptions">') : html.index('<section id="usage">')]
    assert "<td>stopped, work lost</td><td>lost</td>" in journal
    assert "<td>asked to stop</td><td>why</td>" in journal


def test_teams_queue_and_preemptions_say_what_is_missing() -> None:
    html = render_page(overview())
    assert "The cluster file declares no teams" in html
    assert "No gang is waiting for devices." in html
    assert "No gang was asked to stop in the last 7 days." in html
    assert "No team's quota is visible to you." in render_page(overview(teams_declared=True))


BANK = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: bank}
nodes:
  - {name: box, count: 1, cpu: 32, accelerators: {class: gpu, model: H100, count: 8}}
priority_classes:
  - {name: urgent, value: 1000, preempts: true}
  - {name: normal, value: 100}
teams:
  - name: vision
    quota: [{device: gpu, nominal: 4, budget_device_hours: 10}]
    default_priority_class: normal
  - name: secret-team
    quota: [{device: gpu, nominal: 2}]
    default_priority_class: normal
"""


def test_the_ledgers_teams_queue_and_journal_as_each_viewer_may_see_them(  # noqa: PLR0915
    tmp_path: Path,
) -> None:
    """A real ledger: vision borrows the shared pool; secret-team's urgent gang stops it;
    vision's next gang waits. The reader of vision's DAG sees vision's rows only, and
    no word of the secret gang in the reasons."""
    import time

    from tideflow.inventory import load_cluster
    from tideflow.scheduling import GangRequest, Lease, LeaseLedger
    from tideflow.scheduling.accounting import month_window
    from tideflow.ui import gang_queue, preemption_journal, team_quotas
    from tideflow.ui.access import HIDDEN_GANG, Viewer

    cluster = tmp_path / "bank.yaml"
    cluster.write_text(BANK)
    path = tmp_path / "leases.db"
    real = time.time()
    start = real - 3600.0
    clock = [start]
    ledger = LeaseLedger(path, load_cluster(cluster), clock=lambda: clock[0])

    def take(gang_id: str, team: str, devices: int, cls: str = "normal") -> Lease | str:
        priority = {"urgent": 1000, "normal": 100}[cls]
        inference = team == "inference"
        request = GangRequest(
            gang_id,
            team,
            "gpu",
            None,
            1 if inference else devices,
            devices if inference else 1,
            1_000_000 if inference else priority,
            not inference,
            priority_class=None if inference else cls,
        )
        got = ledger.try_acquire(request, "test", 86400)
        return got if isinstance(got, Lease) else got.reason

    first = take("open/r1/train", "vision", 6)  # 4 own + the shared pool's 2
    assert isinstance(first, Lease) and first.borrowed == 2
    assert isinstance(take("broker/inference/0", "inference", 2), Lease)  # the box is full
    clock[0] = start + 600
    why = take("secret/r1/train", "secret-team", 2, "urgent")
    assert isinstance(why, str) and "stopping open/r1/train" in why
    ledger.release(first.lease_id, lost_s=300)
    assert isinstance(take("secret/r1/train", "secret-team", 2, "urgent"), Lease)
    clock[0] = time.time()  # a waiter is forgotten a minute after it last asked
    assert isinstance(take("open/r2/train", "vision", 6), str)  # 4 free: it waits

    reader = Viewer(dag_ids=frozenset({"open"}), teams=frozenset({"vision"}), broker=False)
    admin = Viewer(
        dag_ids=frozenset({"open", "secret"}),
        teams=frozenset({"vision", "secret-team"}),
        broker=True,
    )
    now = time.time()
    rows, declared = team_quotas(path, str(cluster), now, viewer=reader)
    assert declared and [r.team for r in rows] == ["vision"]
    month_start = month_window(now)[0]
    held = 6 * max(0.0, start + 600 - max(start, month_start)) / 3600
    (vision,) = rows
    assert (vision.device, vision.nominal, vision.in_use, vision.borrowed) == ("gpu", 4, 0, 0)
    assert (round(vision.month_hours, 6), vision.budget_hours) == (round(held, 6), 10.0)
    everyone, _ = team_quotas(path, str(cluster), now, viewer=admin)
    assert [(r.team, r.nominal, r.in_use) for r in everyone] == [
        ("secret-team", 2, 2),
        ("vision", 4, 0),
    ]

    queue = gang_queue(path, str(cluster), now, viewer=reader)
    assert [(q.gang_id, q.team, q.priority_class, q.devices) for q in queue] == [
        ("open/r2/train", "vision", "normal", 6)
    ]
    assert queue[0].reason  # the ledger's reason, whatever it is

    journal = preemption_journal(path, str(cluster), start - 1, viewer=reader)
    assert [(j.gang_id, j.action) for j in journal] == [
        ("open/r1/train", "forced"),  # newest first
        ("open/r1/train", "evict"),
    ]
    evict = journal[1].reason
    # secret-team is below its nominal quota and vision above its own: a reclaim
    assert evict.startswith(f"reclaimed for {HIDDEN_GANG}"), evict
    shown = [*map(asdict, rows), *map(asdict, queue), *map(asdict, journal)]
    assert "secret" not in json.dumps(shown)
    seen = preemption_journal(path, str(cluster), start - 1, viewer=admin)[1].reason
    assert seen.startswith("reclaimed for secret/r1/train"), seen
    assert team_quotas(path, None, now, viewer=admin) == ([], False)  # no teams declared
    missing = tmp_path / "none.db"
    assert gang_queue(missing, str(cluster), now, viewer=admin) == []
    assert preemption_journal(missing, str(cluster), 0.0, viewer=admin) == []
    assert not missing.exists()
