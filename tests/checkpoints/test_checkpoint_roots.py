"""A gang writes and retains checkpoints only inside its own run's prefix.

``checkpoint.store`` names a root; the gang's store is
``<root>/<PIPELINE>/<RUN>/<STEP>/checkpoints``, and the root must be the
artifact root or one the platform declares for the team
(``TIDEFLOW_CHECKPOINT_ROOTS``). Once, a pipeline naming another run's store
with ``keep_last: 1`` deleted that run's checkpoints.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.gangs.test_gang_operator import run_dag, states
from tests.pipelines.test_data_prep import xcom
from tests.stack.test_cli import tideflow
from tideflow.checkpoint import CheckpointManager
from tideflow.storage.roots import StoreRootError, check_root, declared_roots, is_within

WORKER = str(Path(__file__).parents[1] / "retention_worker.py")


def pipeline(tmp_path: Path, store: str, team: str = "qa") -> Path:
    path = tmp_path / "confined.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        apiVersion: tideflow/v1
        kind: Pipeline
        metadata: {{name: confined, team: {team}}}
        steps:
          - name: train
            gang_training:
              entrypoint: [python, {WORKER}]
              workers: 1
              device: {{class: cpu}}
              checkpoint: {{store: "{store}", keep_last: 1}}
        """)
    )
    return path


@pytest.mark.processes
@pytest.mark.usefixtures("airflow_home")
def test_a_store_naming_another_runs_checkpoints_cannot_delete_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    victim_uri = (shared / "other-team" / "run-1" / "checkpoints").as_uri()
    victim = CheckpointManager(victim_uri)
    for step in (10, 20, 30):
        victim.save(step, {"model.pt": b"theirs", "rank-0.pt": b"theirs"}, world_size=1)
    monkeypatch.setenv("TIDEFLOW_CHECKPOINT_ROOTS", shared.as_uri())

    dag_run = run_dag(pipeline(tmp_path, victim_uri), monkeypatch)

    assert states(dag_run) == {"train": "success"}
    assert [m.step for m in victim.committed()] == [10, 20, 30]
    own = xcom(dag_run, "train")["checkpoint_store"]
    assert own.startswith(victim_uri + "/confined/") and own.endswith("/train/checkpoints")
    assert [m.step for m in CheckpointManager(own).committed()] == [3]


@pytest.mark.processes
def test_validate_refuses_a_store_outside_the_teams_roots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = pipeline(tmp_path, "s3://someone-else/checkpoints")
    done = tideflow("validate", str(path))
    assert done.returncode == 1
    assert (
        f"{path}:10:27: steps[0].gang_training.checkpoint.store: checkpoint store "
        "'s3://someone-else/checkpoints' is outside the roots team 'qa' may write "
        "checkpoints to" in done.stderr
    ), done.stderr
    assert "; a root under " in done.stderr


@pytest.mark.processes
def test_a_root_declared_for_one_team_is_refused_to_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDEFLOW_CHECKPOINT_ROOTS", "s3://shared/ckpt, vision=s3://vision/ckpt")
    assert (
        tideflow("validate", str(pipeline(tmp_path, "s3://vision/ckpt/x", "vision"))).returncode
        == 0
    )
    assert tideflow("validate", str(pipeline(tmp_path, "s3://shared/ckpt", "qa"))).returncode == 0
    refused = tideflow("validate", str(pipeline(tmp_path, "s3://vision/ckpt", "qa")))
    assert refused.returncode == 1 and "outside the roots team 'qa'" in refused.stderr


@pytest.mark.parametrize(
    ("uri", "root", "inside"),
    [
        ("s3://b/ckpt/x", "s3://b/ckpt", True),
        ("s3://b/ckpt", "s3://b/ckpt/", True),
        ("s3://b/ckpt-evil/x", "s3://b/ckpt", False),
        ("s3://b2/ckpt", "s3://b", False),
        ("file:///data/ckpt/a", "file:///data", True),
        ("file:///data2", "file:///data", False),
    ],
)
def test_within_compares_whole_segments(uri: str, root: str, inside: bool) -> None:
    assert is_within(uri, root) is inside


@pytest.mark.parametrize("root", ["file:///data/../etc", "s3://b/./x", "gs://b/x", "/data"])
def test_roots_that_could_escape_are_refused(root: str) -> None:
    with pytest.raises(StoreRootError):
        check_root(root, "qa", ["file:///data", "s3://b"])


def test_declared_roots_per_team() -> None:
    declared = "s3://shared, vision=s3://v, nlp=s3://n"
    assert declared_roots(declared, "vision") == ("s3://shared", "s3://v")
    assert declared_roots(declared, "qa") == ("s3://shared",)
