"""What the broker's commands tell a user: ``tideflow broker run --dry-run`` says on every
line that it is a dry run, when, the load it read, the forecast and the GPUs needed (and
that it rounds up to whole nodes); ``tideflow broker simulate`` prints no SLO promise for
a static split, refuses a split that is not whole nodes of the cluster, and carries no
research knob (bounds and node placement are bench/'s)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tideflow.broker.forecast import Forecast
from tideflow.broker.policy import Action, BrokerDecision, PolicyConfig, Snapshot
from tideflow.cli import main

CLUSTER = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: lab}
nodes:
  - {name: h100, count: 2, cpu: 64, accelerators: {class: gpu, model: H100, count: 8}}
"""
WHEN = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")


@pytest.fixture
def steady(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Steady 100 rps at 10 rps per GPU on two 8-GPU nodes: 10 GPUs, 11 with headroom."""
    trace = tmp_path / "load.csv"
    trace.write_text("start_s,rate_rps\n" + "".join(f"{i * 600},100\n" for i in range(7 * 144)))
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER)
    home = tmp_path / "home"
    monkeypatch.setenv("TIDEFLOW_HOME", str(home))
    monkeypatch.setenv("TIDEFLOW_CLUSTER_FILE", str(cluster))
    monkeypatch.setenv("TIDEFLOW_BROKER_LOAD", f"trace:{trace}")
    monkeypatch.setenv("TIDEFLOW_BROKER_PER_GPU_RPS", "10")
    monkeypatch.setenv("TIDEFLOW_BROKER_NODE_GPUS", "8")
    return home


def test_each_dry_run_line_says_so_with_time_load_forecast_and_need(
    steady: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["broker", "run", "--dry-run", "--steps", "2", "--interval", "0"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    for line in lines:
        assert line.startswith("dry run (nothing moved): would grow: 16 inference GPUs of 16:")
        assert WHEN.search(line), line
        assert "load 100 rps" in line and "forecast " in line and " rps" in line
        assert "needs 11 GPU(s), takes 16: whole nodes of 8" in line, line


def test_a_real_step_keeps_its_head_and_says_no_dry_run(
    steady: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["broker", "run", "--once"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("grow: 16 inference GPUs of 16:") and "dry run" not in out
    assert WHEN.search(out) and "needs 11 GPU(s), takes 16: whole nodes of 8" in out


def step(needed: int | None, wanted: int | None, node_gpus: int = 4) -> Any:
    from tideflow.broker.service import Step

    config = PolicyConfig(
        total_gpus=16, node_gpus=node_gpus, per_gpu_rps=10.0, headroom=0.0, min_inference_gpus=0
    )
    snapshot = Snapshot(
        now_s=0.0,
        inference_gpus=0,
        measured_rps=None if needed is None else needed * 10.0,
        forecast=Forecast(None, None, None if wanted is None else wanted * 10.0, "level"),
        idle_training_gpus=16,
    )
    decision = BrokerDecision(Action.GROW, 4, needed, wanted, reason="why")
    return Step(0.0, decision, None, snapshot, config)


def test_the_line_names_the_rounding_only_when_there_is_one() -> None:
    from tideflow.broker.service import step_line

    assert "needs 3 GPU(s), takes 4: whole nodes of 4; why" in step_line(step(3, 3), True)
    assert "1970-01-01 00:00:00 UTC" in step_line(step(3, 3), True)
    exact = step_line(step(4, 2), False)
    assert "needs 4 GPU(s);" in exact and "takes" not in exact
    blind = step_line(step(None, None), True)
    assert "load: no data" in blind and "forecast: none" in blind and "needs: unknown" in blind


def simulate(*extra: str) -> list[str]:
    base = ["broker", "simulate", "--trace", "synthetic", "--days", "1", "--per-gpu-rps", "25"]
    return [*base, *extra]


@pytest.mark.parametrize("policy", ["static:139", "static:208"])
def test_simulate_refuses_a_static_split_that_is_not_whole_nodes(
    policy: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(simulate("--policy", policy)) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"'{policy}'" in err and "8-GPU nodes" in err
    assert "accepted: 0, 8, 16, ... 200" in err


def test_simulate_prints_no_slo_promise_for_a_static_split(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(simulate("--policy", "static:136")) == 0
    assert "slo_promised" not in capsys.readouterr().out
    assert main(simulate("--policy", "static:136", "--json")) == 0
    assert "slo_promised" not in json.loads(capsys.readouterr().out)
    assert main(simulate("--policy", "tidal", "--json")) == 0
    assert "slo_promised" in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "research",
    [["--placement", "nodes"], ["--bound-mechanics", "tidal"], ["--insured-share", "0.5"]],
)
def test_simulate_carries_no_research_knobs(
    research: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Bounds, decompositions and node placement are bench/'s (``research``), not options
    a user's comparison of the broker with a static and a cron split needs."""
    with pytest.raises(SystemExit) as refused:
        main(simulate(*research))
    assert refused.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


@pytest.mark.parametrize("bound", ["oracle", "oracle-burst-blind", "oracle-hindsight-cross"])
def test_simulate_refuses_a_bound_as_a_policy(
    bound: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(simulate("--policy", bound)) == 2
    err = capsys.readouterr().err
    assert "use 'tidal', 'static:N' (N GPUs for inference) or 'cron:H'" in err
