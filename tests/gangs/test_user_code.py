"""A team's own code, next to its pipeline, used by every step on the local backend.

The modules live in a directory the pipeline names (``code: {path: ../src}``),
on no global PYTHONPATH: data prep, the gang's workers (a command, with its
``args`` as options and the step context files data prep gets) and the
evaluation import them through Airflow's real ``dag.test()``, the promotion's
builder through its operator; the gang's per-worker resources are recorded in
its job.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tideflow.backends.local import LocalBackend
from tideflow.config import Settings
from tideflow.gangs import gang_id_for

# Each step runs its entry point in a process of its own (tideflow.steps.process).
pytestmark = pytest.mark.processes

MODULES = {
    "__init__.py": "",
    "prep.py": """\
        def run(ctx, **args):
            return {"table": f"from-teamcode/{ctx.step}"}
        """,
    # Run as `python -m teamcode.train ...`: the module itself is found on the code path.
    "train.py": """\
        import json, os, sys
        from pathlib import Path

        from tideflow.checkpoint import CheckpointManager

        out = Path(sys.argv[sys.argv.index("--out") + 1])
        rank = os.environ["RANK"]
        files = {
            name: os.environ.get(f"TIDEFLOW_STEP_{name}")
            for name in ("CONTEXT", "ARGS", "OUTPUTS")
        }
        report = {
            "argv": sys.argv[1:],
            "files": files,
            "context": json.loads(Path(files["CONTEXT"]).read_text()),
            "args": json.loads(Path(files["ARGS"]).read_text()),
        }
        Path(files["OUTPUTS"]).write_text(json.dumps({"rank": rank}))
        (out / f"rank-{rank}.json").write_text(json.dumps(report))
        if rank == "0":
            CheckpointManager(os.environ["TIDEFLOW_CHECKPOINT_URI"]).save(
                1, {"model.pt": b"weights"}, metrics={"loss": 0.5}
            )
        """,
    "evaluate.py": """\
        def score(ctx, checkpoint_store=None, **args):
            return {"accuracy": 0.75}
        """,
    "build.py": """\
        def log_model(ctx, run_id=None, **args):
            return {"model_uri": f"models:/teamcode-{run_id}"}
        """,
}


def team_repo(root: Path) -> Path:
    """A repository with its modules under src/teamcode and its pipelines under pipelines/."""
    package = root / "src" / "teamcode"
    package.mkdir(parents=True)
    for name, text in MODULES.items():
        (package / name).write_text(textwrap.dedent(text))
    (root / "out").mkdir()
    (root / "pipelines").mkdir()
    return root / "pipelines"


def pipeline(root: Path) -> Path:
    path = team_repo(root) / "user-code.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        apiVersion: tideflow/v1
        kind: Pipeline
        metadata: {{name: user-code, team: qa}}
        params:
          lr: {{type: float, default: 0.25}}
        code: {{path: ../src}}
        steps:
          - name: prep
            data_prep:
              entrypoint: teamcode.prep:run
              outputs: [table]
          - name: train
            needs: [prep]
            gang_training:
              entrypoint: [python, -m, teamcode.train, --out, {root / "out"}]
              args:
                lr: "{{{{ params.lr }}}}"
                epochs: 2
                amp: true
                compile: false
                layers: [64, 32]
              workers: 2
              device: {{class: cpu}}
              resources: {{memory: 512Mi}}
              max_restarts: 0
          - name: evaluate
            needs: [train]
            evaluation:
              entrypoint: teamcode.evaluate:score
              devices: [cpu]
              metrics: [accuracy]
          - name: promote
            needs: [evaluate]
            promote_checkpoint:
              model: teamcode-model
              builder: teamcode.build:log_model
              gate: {{metric: accuracy}}
        """)
    )
    return path


def build(path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from tideflow.compile.dag_plan import compile_dag_plan
    from tideflow.dag.builder import build_dag
    from tideflow.spec import load_pipeline

    monkeypatch.setenv("TIDEFLOW_PIPELINES_DIR", str(path))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    dag = build_dag(compile_dag_plan(load_pipeline(path)))
    for task in dag.tasks:  # poll quickly in tests
        for attribute in ("lease_poll_s", "gang_poll_s", "poll_s"):
            if hasattr(task, attribute):
                setattr(task, attribute, 0.3)
    return dag


def xcom(dag_run: Any, task_id: str) -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(
            XComModel.get_many(
                run_id=dag_run.run_id, dag_ids=dag_run.dag_id, task_ids=task_id, key="return_value"
            )
        ).first()
        return None if row is None else XComModel.deserialize_value(row)


@pytest.mark.usefixtures("airflow_home")
def test_every_step_finds_the_pipelines_modules_with_args_and_context_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = pipeline(tmp_path)
    # without the promotion, which needs a checkpoint worth registering (see below)
    path.write_text(path.read_text().split("  - name: promote")[0])
    dag_run = build(path, monkeypatch).test()
    states = {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}
    assert states == {"prep": "success", "train": "success", "evaluate": "success"}

    # data prep and the evaluation imported teamcode from the pipeline's code directory
    assert xcom(dag_run, "prep") == {"table": "from-teamcode/prep"}
    assert xcom(dag_run, "evaluate")["metrics"] == {"accuracy": 0.75}

    # the gang's command: the module from the code directory, args appended as options
    reports = {
        int(p.stem.split("-")[1]): json.loads(p.read_text())
        for p in (tmp_path / "out").glob("rank-*.json")
    }
    assert sorted(reports) == [0, 1]
    for rank, report in reports.items():
        # the command as written, then the args as options, by key: true a flag, false
        # left out, a list as JSON
        assert report["argv"] == [
            "--out",
            str(tmp_path / "out"),
            "--amp",
            "--epochs",
            "2",
            "--layers",
            "[64, 32]",
            "--lr",
            "0.25",
        ]
        # the files a data-prep step gets: its context and args; an outputs file per rank
        assert report["context"]["pipeline"] == "user-code"
        assert report["context"]["step"] == "train"
        assert report["context"]["run_id"] == dag_run.run_id
        assert report["context"]["params"] == {"lr": 0.25}
        assert report["args"] == {
            "lr": 0.25,
            "epochs": 2,
            "amp": True,
            "compile": False,
            "layers": [64, 32],
        }
        outputs = Path(report["files"]["OUTPUTS"])
        assert outputs.name == f"outputs-rank-{rank}.json"
        assert json.loads(outputs.read_text()) == {"rank": str(rank)}

    # the per-worker resources reach the local job (recorded; workers are not confined)
    gang = gang_id_for("user-code", dag_run.run_id, "train")
    job = LocalBackend(Settings.from_env().gangs_dir).job(gang)
    assert job is not None and job.memory == "512Mi" and job.cpu is None
    assert job.env["PYTHONPATH"].split(":")[0] == str(tmp_path / "src")


def test_the_promotion_builder_imports_the_pipelines_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tideflow.steps.context import StepContext

    dag = build(pipeline(tmp_path), monkeypatch)
    promote = dag.get_task("promote")
    assert promote.code_path == str(tmp_path / "src")
    ctx = StepContext("user-code", "qa", "promote", "user-code", "run-1", 1, "file:///tmp")
    # the operator's own child-process runner, as its execute() calls the builder
    built = promote.run_entrypoint(ctx, promote.builder, {"run_id": "r1"}, {})
    assert built == {"model_uri": "models:/teamcode-r1"}
    # every step of the DAG gets the same directory
    assert {task.code_path for task in dag.tasks} == {str(tmp_path / "src")}


def test_without_the_code_location_the_modules_are_not_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the same builder fails when the pipeline names no code directory."""
    from airflow.sdk.exceptions import AirflowException

    from tideflow.steps.context import StepContext

    path = pipeline(tmp_path)
    path.write_text(path.read_text().replace("code: {path: ../src}\n", ""))
    promote = build(path, monkeypatch).get_task("promote")
    assert promote.code_path is None
    ctx = StepContext("user-code", "qa", "promote", "user-code", "run-1", 1, "file:///tmp")
    with pytest.raises(AirflowException, match="No module named 'teamcode'"):
        promote.run_entrypoint(ctx, promote.builder, {"run_id": "r1"}, {})
