"""The local broker's node size comes from the cluster file: it moves whole nodes of the
size the file declares, with ``TIDEFLOW_BROKER_NODE_GPUS`` left for a cluster (or for a
file whose nodes differ in size, which it must then name), and a size it cannot use is
one message naming the variable and the nodes, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tideflow.broker.service import BrokerSettings, open_local
from tideflow.cli import main

CLUSTER = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {{name: lab}}
nodes:
{nodes}
teams:
  - {{name: inference, quota: [{{device: gpu, nominal: {quota}}}]}}
  - {{name: research, quota: [{{device: gpu, nominal: {quota}}}]}}
"""
ONE_GPU = "  - {name: n, count: 8, cpu: 8, accelerators: {class: gpu, model: T4, count: 1}}"
EIGHT_GPU = "  - {name: big, count: 2, cpu: 96, accelerators: {class: gpu, model: H100, count: 8}}"


def cluster_file(tmp_path: Path, nodes: str, quota: int) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER.format(nodes=nodes, quota=quota))
    return path


def broker_run(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    home: Path,
    env: dict[str, str],
) -> tuple[int, str]:
    """``tideflow broker run --dry-run --once`` as a user runs it: its exit code and output."""
    monkeypatch.setenv("TIDEFLOW_HOME", str(home))
    monkeypatch.setenv("TIDEFLOW_BROKER_LOAD", "synthetic:100")
    monkeypatch.setenv("TIDEFLOW_BROKER_PER_GPU_RPS", "50")
    monkeypatch.delenv("TIDEFLOW_BROKER_NODE_GPUS", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = main(["broker", "run", "--dry-run", "--once"])
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.parametrize(
    "case",
    [(ONE_GPU, 4, 1, 8), (EIGHT_GPU, 8, 8, 16)],
    ids=["eight one-GPU nodes", "two eight-GPU nodes"],
)
def test_the_local_broker_moves_whole_nodes_of_the_cluster_files_size(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    case: tuple[str, int, int, int],
) -> None:
    """Eight one-GPU nodes and inference's quota of 4 (the issue's cluster), and two
    eight-GPU nodes: each broker starts, moving nodes of the file's size."""
    nodes, quota, node_gpus, total = case
    path = cluster_file(tmp_path, nodes, quota)
    code, out = broker_run(
        monkeypatch, capsys, tmp_path / "home", {"TIDEFLOW_CLUSTER_FILE": str(path)}
    )
    assert code == 0, out
    assert f"inference GPUs of {total}:" in out and "Traceback" not in out

    settings = BrokerSettings.from_env()
    assert settings is not None and settings.node_gpus is None
    _, actuator, config, _ = open_local(
        settings, tmp_path / "leases.db", tmp_path / "broker.db", str(path)
    )
    assert (config.node_gpus, actuator.node_gpus, config.ceiling) == (node_gpus,) * 2 + (quota,)


def test_nodes_of_different_sizes_need_the_size_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Eight one-GPU nodes and two of eight: the broker cannot tell which it moves. The
    message names the variable and which nodes hold what; set, it must be one of them."""
    path = cluster_file(tmp_path, f"{ONE_GPU}\n{EIGHT_GPU}", 8)
    home = tmp_path / "home"
    env = {"TIDEFLOW_CLUSTER_FILE": str(path)}
    code, out = broker_run(monkeypatch, capsys, home, env)
    assert code == 2 and "Traceback" not in out
    assert len(out.strip().splitlines()) == 1, out
    assert "TIDEFLOW_BROKER_NODE_GPUS" in out
    assert "1 gpu on n-0, n-1, ... n-7 (8 nodes)" in out and "8 gpu on big-0, big-1" in out
    assert not home.exists() or not list(home.iterdir())  # no ledger, no journal

    code, out = broker_run(monkeypatch, capsys, home, {**env, "TIDEFLOW_BROKER_NODE_GPUS": "4"})
    assert code == 2 and "TIDEFLOW_BROKER_NODE_GPUS='4'" in out and "accepted: 1, 8" in out

    for size in ("1", "8"):
        code, out = broker_run(
            monkeypatch, capsys, home, {**env, "TIDEFLOW_BROKER_NODE_GPUS": size}
        )
        assert code == 0 and "inference GPUs of 24:" in out, out


def test_a_size_the_cluster_files_nodes_do_not_have_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The variable set by hand to 8 on one-GPU nodes: locally the file decides, and the
    message says what the nodes hold rather than a quota error about 8-GPU nodes."""
    path = cluster_file(tmp_path, ONE_GPU, 4)
    env = {"TIDEFLOW_CLUSTER_FILE": str(path), "TIDEFLOW_BROKER_NODE_GPUS": "8"}
    code, out = broker_run(monkeypatch, capsys, tmp_path / "home", env)
    assert code == 2 and "Traceback" not in out
    assert "TIDEFLOW_BROKER_NODE_GPUS='8'" in out and "1 gpu on n-0" in out
    assert "accepted: 1" in out
