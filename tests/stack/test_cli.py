"""The ``tideflow`` command line, run as a user runs it (a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tideflow.cli import build_parser


def tideflow(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tideflow.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        check=False,
    )


BROKEN = """\
apiVersion: tideflow/v1
kind: Pipeline
metadata: {name: Broken, team: x}
steps:
  - name: a
    needs: [b]
    data_prep: {entrypoint: "m:f", workerz: 1}
"""


@pytest.mark.processes
def test_validate_clean_directory_exits_zero(repo: Path) -> None:
    done = tideflow("validate", str(repo / "pipelines"))
    assert done.returncode == 0, done.stderr
    assert "1 of 1 pipeline file(s) valid" in done.stdout


@pytest.mark.processes
def test_validate_reports_every_error_and_exits_one(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text(BROKEN)
    done = tideflow("validate", "broken.yaml", cwd=tmp_path)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert lines[0] == "broken.yaml: 3 problems"
    assert lines[1].startswith("broken.yaml:3:18: metadata.name: 'Broken' is not a valid name")
    assert lines[2].startswith("broken.yaml:6:13: steps[0].needs[0]: unknown step 'b'")
    assert lines[3].startswith("broken.yaml:7:36: steps[0].data_prep.workerz: unknown field")
    assert "Traceback" not in done.stderr


@pytest.mark.processes
def test_validate_with_cluster_file_checks_gang_fit(tmp_path: Path) -> None:
    (tmp_path / "cluster.yaml").write_text(
        "apiVersion: tideflow/v1\nkind: Cluster\nmetadata: {name: two-nodes}\nnodes:\n"
        "  - {name: n, count: 2, cpu: 32, accelerators: {class: gpu, model: H100, count: 8}}\n"
    )
    (tmp_path / "big.yaml").write_text(
        "apiVersion: tideflow/v1\nkind: Pipeline\nmetadata: {name: big, team: x}\nsteps:\n"
        "  - name: train\n    gang_training:\n      entrypoint: m:f\n      workers: 3\n"
        "      devices_per_worker: 8\n      device: {class: gpu, model: H100}\n"
    )
    done = tideflow("validate", "big.yaml", "--cluster", "cluster.yaml", cwd=tmp_path)
    assert done.returncode == 1
    assert (
        "big.yaml:8:16: steps[0].gang_training.workers: 3 workers x 8 H100 gpu can never"
        in done.stderr
    )
    # no inventory given (and the made-up entry point m:f not imported)
    assert tideflow("validate", "big.yaml", "--no-imports", cwd=tmp_path).returncode == 0


@pytest.mark.processes
def test_bad_cluster_file_is_reported_with_location(tmp_path: Path, repo: Path) -> None:
    (tmp_path / "cluster.yaml").write_text(
        "apiVersion: tideflow/v1\nkind: Cluster\nmetadata: {name: c}\nnodes:\n"
        "  - {name: n, cpu: 0}\n"
    )
    done = tideflow("validate", str(repo / "pipelines"), "--cluster", "cluster.yaml", cwd=tmp_path)
    assert done.returncode == 1
    assert "cluster.yaml:5:20: nodes[0].cpu: 0 is out of range; an integer >= 1" in done.stderr


@pytest.mark.processes
def test_schema_command_matches_shipped_schema(repo: Path) -> None:
    done = tideflow("schema")
    assert done.returncode == 0
    shipped = (repo / "pipelines" / "schema.json").read_text()
    assert done.stdout == shipped, (
        "pipelines/schema.json is stale: run `tideflow schema -o pipelines/schema.json`"
    )
    schema = json.loads(shipped)
    assert schema["properties"]["apiVersion"]["const"] == "tideflow/v1"
    assert schema["additionalProperties"] is False


def test_schema_validates_the_example_and_rejects_unknown_keys(repo: Path) -> None:
    import jsonschema
    import yaml

    schema = json.loads((repo / "pipelines" / "schema.json").read_text())
    example = yaml.safe_load((repo / "pipelines" / "digits.yaml").read_text())
    jsonschema.validate(example, schema)
    example["steps"][0]["data_prep"]["workerz"] = 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(example, schema)


@pytest.mark.processes
def test_plan_shows_order_pools_and_resources(repo: Path) -> None:
    done = tideflow("plan", str(repo / "tests" / "data" / "pipelines" / "full.yaml"))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    order = [out.index(f". {name} [") for name in ("prep", "train", "evaluate", "promote")]
    assert order == sorted(order)
    assert "pool tideflow-gpu (8 slot(s)), retries 2, timeout 6h" in out
    assert "gang: workers 2 (params.workers), 4 gpu H100 each" in out
    assert "devices (preference): npu, gpu-spare, cpu" in out
    # a step without a timeout has none, not "nones"; params as the file spells them
    assert "pool tideflow-npu (1 slot(s)), retries 0, timeout none\n" in out
    assert "  lr: float = 0.001, minimum 1e-06, maximum 1.0\n" in out
    assert '  optimizer: enum = "adam", one of "sgd", "adam"\n' in out
    assert "nones" not in out and "{{" not in out


@pytest.mark.processes
def test_plan_shows_templated_fields_at_their_params_defaults(tmp_path: Path) -> None:
    """A field that is one param's template shows that param's default and its name."""
    (tmp_path / "cluster.yaml").write_text(
        "apiVersion: tideflow/v1\nkind: Cluster\nmetadata: {name: lab}\nnodes:\n"
        "  - {name: n, count: 2, cpu: 32, accelerators: {class: gpu, model: H100, count: 8}}\n"
    )
    (tmp_path / "p.yaml").write_text(
        "apiVersion: tideflow/v1\nkind: Pipeline\nmetadata: {name: p, team: x}\n"
        "params:\n  workers: {type: int, default: 3}\n  per: {type: int, default: 2}\n"
        "  shards: {type: int, default: 1}\n"
        "steps:\n  - name: train\n    timeout: 5400\n    gang_training:\n"
        "      entrypoint: m:f\n      workers: '{{ params.workers }}'\n"
        "      min_workers: '{{ params.shards }}'\n"
        "      devices_per_worker: '{{ params.per }}'\n      device: {class: gpu, model: H100}\n"
    )
    done = tideflow("plan", "p.yaml", "--cluster", "cluster.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "pool tideflow-gpu (6 slot(s)), retries 0, timeout 1h30m\n" in done.stdout
    assert (
        "gang: workers 3 (params.workers), min_workers 1 (params.shards), "
        "2 (params.per) gpu H100 each; cluster 'lab' has room for 8 such worker(s)\n"
    ) in done.stdout
    assert "{{" not in done.stdout


MISSING_SCRIPT = """\
apiVersion: tideflow/v1
kind: Pipeline
metadata: {name: own, team: vision}
steps:
  - name: train
    gang_training:
      entrypoint: [python, train.py]
      workers: 1
      max_restarts: 0
      checkpoint: {optional: true}
"""


@pytest.mark.processes
def test_a_failed_run_ends_naming_its_failed_step_and_why(tmp_path: Path) -> None:
    """A newcomer's gang command names its script by a path the workers' directory (the
    one `tideflow run` started in) lacks: the run's last line names the failed step, and
    the step's error quotes the worker."""
    (tmp_path / "own.yaml").write_text(MISSING_SCRIPT)
    done = subprocess.run(
        [sys.executable, "-m", "tideflow.cli", "run", "own.yaml"],
        cwd=tmp_path,
        env={**os.environ, "TIDEFLOW_HOME": str(tmp_path / "home")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "pipeline own: failed (failed step: train)"
    assert "rank 0 printed:" in done.stdout and "can't open file" in done.stdout


@pytest.mark.processes
def test_run_rejects_unknown_and_out_of_range_params(repo: Path) -> None:
    digits = str(repo / "pipelines" / "digits.yaml")
    unknown = tideflow("run", digits, "--param", "sed=1")
    assert unknown.returncode == 1
    assert "unknown param 'sed'; did you mean 'seed'?" in unknown.stderr
    too_big = tideflow("run", digits, "--param", "validation_fraction=0.9")
    assert too_big.returncode == 1
    assert "0.9 is above its maximum 0.5" in too_big.stderr


@pytest.mark.processes
def test_every_command_has_help() -> None:
    parser = build_parser()
    subcommands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(subcommands) == {
        "validate",
        "schema",
        "plan",
        "compile",
        "run",
        "gangs",
        "pools",
        "broker",
        "usage",
    }
    for name in subcommands:
        done = tideflow(name, "--help")
        assert done.returncode == 0 and "usage: tideflow" in done.stdout, name


CLUSTER = (
    "apiVersion: tideflow/v1\nkind: Cluster\nmetadata: {name: lab}\nnodes:\n"
    "  - {name: n, count: 2, cpu: 32, accelerators: {class: gpu, model: H100, count: 8}}\n"
)
BAD_CLUSTER = (
    "apiVersion: tideflow/v1\nkind: Cluster\nmetadata: {name: c}\nnodes:\n  - {name: n, cpu: 0}\n"
)


@pytest.mark.processes
def test_validate_cluster_alone_checks_just_the_cluster_file(tmp_path: Path) -> None:
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    done = tideflow("validate", "--cluster", "cluster.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "cluster file cluster.yaml valid" in done.stdout
    (tmp_path / "bad.yaml").write_text(BAD_CLUSTER)
    bad = tideflow("validate", "--cluster", "bad.yaml", cwd=tmp_path)
    assert bad.returncode == 1
    assert "bad.yaml:5:20: nodes[0].cpu: 0 is out of range; an integer >= 1" in bad.stderr
    nothing = tideflow("validate", cwd=tmp_path)
    assert nothing.returncode == 2
    assert "name pipeline files or directories, or --cluster FILE" in nothing.stderr


@pytest.mark.processes
def test_validate_directory_checks_a_cluster_file_as_a_cluster_file(
    tmp_path: Path, repo: Path
) -> None:
    (tmp_path / "digits.yaml").write_text((repo / "pipelines" / "digits.yaml").read_text())
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    done = tideflow("validate", ".", "--no-imports", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "2 of 2 file(s) valid (1 pipeline, 1 cluster)" in done.stdout
    (tmp_path / "cluster.yaml").write_text(BAD_CLUSTER)
    bad = tideflow("validate", ".", "--no-imports", cwd=tmp_path)
    assert bad.returncode == 1
    assert bad.stderr.startswith("cluster.yaml: 1 problem\n"), bad.stderr
    assert "cluster.yaml:5:20: nodes[0].cpu: 0 is out of range" in bad.stderr
    assert "1 of 2 file(s) valid (1 pipeline, 1 cluster)" in bad.stderr


PRIORITY_CLUSTER = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: prio}
nodes:
  - {name: h100, count: 2, cpu: 64, accelerators: {class: gpu, model: H100, count: 8}}
priority_classes:
  - {name: high, value: 500}
  - {name: batch, value: 0}
teams:
  - name: vision
    quota: [{device: gpu, model: H100, nominal: 8}]
    priority_classes: [high, batch]
    default_priority_class: batch
"""


def gang_pipeline(tmp_path: Path, named: str) -> None:
    (tmp_path / "p.yaml").write_text(
        f"apiVersion: tideflow/v1\nkind: Pipeline\nmetadata: {{name: p, team: vision{named}}}\n"
        "steps:\n  - name: train\n    gang_training:\n      entrypoint: m:f\n"
        "      workers: 1\n      priority: 5\n      device: {class: gpu, model: H100}\n"
    )


@pytest.mark.processes
def test_plan_shows_the_priority_class_of_gang_steps(tmp_path: Path) -> None:
    (tmp_path / "cluster.yaml").write_text(PRIORITY_CLUSTER)
    gang_pipeline(tmp_path, ", priority_class: high")
    named = tideflow("plan", "p.yaml", "--cluster", "cluster.yaml", cwd=tmp_path)
    assert named.returncode == 0, named.stderr
    assert "     priority: class high (params.priority_class), value 500\n" in named.stdout
    assert '  priority_class: string = "high"\n' in named.stdout  # the param a run may set
    alone = tideflow("plan", "p.yaml", cwd=tmp_path)
    assert "     priority: class high (params.priority_class)\n" in alone.stdout

    gang_pipeline(tmp_path, "")
    default = tideflow("plan", "p.yaml", "--cluster", "cluster.yaml", cwd=tmp_path)
    assert "     priority: class batch (team vision's default), value 0\n" in default.stdout
    unknown = tideflow("plan", "p.yaml", cwd=tmp_path)
    assert (
        "     priority: 5 (the step's own, unless the cluster file gives team vision "
        "a default class)\n"
    ) in unknown.stdout


def test_the_demos_broker_steps_wait_as_long_as_a_broker_run_may_take(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A triggered broker run may queue behind a scheduled one (the DAG allows one active
    run), then sense for up to TIDEFLOW_BROKER_SENSE_S and wait out a reclaim's grace.
    The teams story waited 180 s for each run (the lab's sense alone is 150 s), and in a
    busy test run it gave up on a run still going."""
    from tideflow.stack.__main__ import broker_run_bound_s
    from tideflow.stack.team_story import BROKER_ENV

    for name, value in BROKER_ENV.items():
        monkeypatch.setenv(name, value)
    sense = float(BROKER_ENV["TIDEFLOW_BROKER_SENSE_S"])
    grace = float(BROKER_ENV["TIDEFLOW_BROKER_GRACE_S"])
    assert broker_run_bound_s() > 2 * (sense + grace)
    monkeypatch.setenv("TIDEFLOW_BROKER_SENSE_S", "10")
    assert broker_run_bound_s() == 2 * (10 + grace) + 120
