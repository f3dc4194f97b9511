"""The standalone step executor: what the compiled Argo workflow's step containers run.

The commands come from the compiled WorkflowTemplate itself, with Argo's
variables filled in as Argo would (tests/argo_run.py): the digits data prep
writes its split into a file:// artifact root and its output parameters to
files; the whole workflow then runs here step after step, evaluation scores the
gang's best checkpoint and logs its metrics and that choice to an MLflow run, and
promotion registers and promotes that checkpoint exactly once. The gang step's
driver talks to the Kubernetes fake (tests/kubefake: no API server or Volcano
controller can run here) as its own ServiceAccount, and the Job's one worker
runs here as a child process.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pytest
import yaml

from tests.argo_run import REPO, run_exit_handler, run_locally, run_task, templates
from tests.kubefake import KubeFake, gang_cluster
from tideflow.argo import compile_pipeline
from tideflow.checkpoint import CheckpointManager
from tideflow.kube import KubeSettings
from tideflow.steps.standalone_io import assign, parse_assignment, read_value

WORKFLOW = "digits-x7k2p"
PREDICT_WITHOUT_TIDEFLOW = """
import sys
# where only the stated requirements are installed: any import of these fails
for name in ("tideflow", "lightning", "pytorch_lightning", "transformers"):
    sys.modules[name] = None
import mlflow.pyfunc, numpy
model = mlflow.pyfunc.load_model(sys.argv[1])
print(tuple(model.predict(numpy.zeros((3, 64), dtype=numpy.float32)).shape))
"""


def compiled(tmp_path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """digits compiled for stores under ``tmp_path``, and the environment a pod would add."""
    settings = KubeSettings(
        artifact_root=(tmp_path / "artifacts").as_uri(),
        mlflow_tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
    )
    text = compile_pipeline(REPO / "pipelines" / "digits.yaml", settings=settings)[1]
    return yaml.safe_load(text), {"TIDEFLOW_HOME": str(tmp_path / "home")}


@pytest.fixture(scope="module")
def migrated_mlflow(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow SQLite store with MLflow's schema made, once: a step's process that
    opens a new store spends about 3.5 s of CPU making it."""
    from mlflow.tracking import MlflowClient

    db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture
def tracking(tmp_path: Path, migrated_mlflow: Path) -> str:
    """The tracking URI of this test's own MLflow store, ``tmp_path/mlflow.db`` (where
    ``compiled`` points the workflow), empty and migrated."""
    db = tmp_path / "mlflow.db"
    shutil.copyfile(migrated_mlflow, db)
    return f"sqlite:///{db}"


@pytest.fixture
def cluster() -> Iterator[KubeFake]:
    with gang_cluster() as cluster:
        yield cluster


def load_npz(uri: str) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(Path(urlparse(uri).path).read_bytes())) as data:
        return {key: data[key] for key in data.files}


@pytest.mark.processes
def test_data_prep_runs_the_digits_entry_point_and_writes_its_outputs(tmp_path: Path) -> None:
    workflow, env = compiled(tmp_path)
    outputs = run_task(
        workflow,
        "prepare-data",
        tmp_path / "out",
        done={},
        workflow_name=WORKFLOW,
        env={**env, "MLFLOW_TRACKING_URI": ""},  # untracked: this test is about the data
        validation_fraction=0.25,
    )
    root = (tmp_path / "artifacts").as_uri()
    assert outputs == {
        "train": f"{root}/digits/{WORKFLOW}/prepare-data/train.npz",
        "validation": f"{root}/digits/{WORKFLOW}/prepare-data/validation.npz",
    }
    train, validation = load_npz(outputs["train"]), load_npz(outputs["validation"])
    # The workflow parameter reached the entry point as a number.
    assert len(validation["y"]) == 450 and len(train["y"]) == 1347
    assert set(np.unique(validation["y"])) == set(range(10))


@pytest.mark.processes
def test_the_compiled_workflow_runs_step_by_step(
    tmp_path: Path, cluster: KubeFake, tracking: str
) -> None:
    from mlflow.tracking import MlflowClient

    workflow, env = compiled(tmp_path)
    outputs = run_locally(
        workflow,
        tmp_path / "out",
        workflow_name=WORKFLOW,
        env=env,
        cluster=cluster,
        workers=1,
        epochs=3,
    )
    evaluated = outputs["evaluate"]
    store = f"{(tmp_path / 'artifacts').as_uri()}/digits/{WORKFLOW}/train/checkpoints"
    # The gang step reported its store and newest checkpoint; evaluation read that store
    # and scored its best checkpoint by the gang's keep_best (val_accuracy; checkpoint: best
    # by default), of equals the earliest.
    assert outputs["train"]["checkpoint_store"] == store
    manifests = CheckpointManager(store).committed()
    assert outputs["train"]["checkpoint"] == manifests[-1].uri
    best = max(
        (m for m in manifests if "val_accuracy" in m.metrics),
        key=lambda m: m.metrics["val_accuracy"],
    )
    assert evaluated["checkpoint"] == best.uri
    selection = json.loads(evaluated["checkpoint_selection"])
    assert selection["choice"] == "best" and selection["selected"] == "best"
    assert selection["step"] == best.step == int(evaluated["checkpoint_step"])
    assert evaluated["checkpoint_store"] == store
    assert (
        evaluated["checkpoint"]
        == f"{store}/step-{int(evaluated['checkpoint_step']):012d}/MANIFEST.json"
    )
    metrics = json.loads(evaluated["metrics"])
    assert set(metrics) == {"accuracy", "loss"} and metrics["accuracy"] > 0.8
    assert float(evaluated["accuracy"]) == metrics["accuracy"]

    client = MlflowClient(tracking_uri=tracking)
    experiment = client.get_experiment_by_name("digits")
    (run,) = client.search_runs([experiment.experiment_id], "tags.`tideflow.step` = 'evaluate'")
    assert run.data.metrics == metrics and run.info.status == "FINISHED"
    assert run.data.tags["tideflow.dag_run_id"] == WORKFLOW
    # No operator made the gang step's run: its rank 0 did, under the same pipeline run,
    # logged its loss curve and checkpoints there, and ended it when training ended.
    (train,) = client.search_runs([experiment.experiment_id], "tags.`tideflow.step` = 'train'")
    assert train.info.status == "FINISHED"
    assert train.data.tags["mlflow.parentRunId"] == run.data.tags["mlflow.parentRunId"]
    # The exit handler closed the workflow's parent run with the workflow's status.
    assert client.get_run(run.data.tags["mlflow.parentRunId"]).info.status == "FINISHED"
    assert len(client.get_metric_history(train.info.run_id, "loss")) >= 3
    assert train.data.tags["tideflow.checkpoint.latest"] == outputs["train"]["checkpoint"]
    assert run.data.tags["tideflow.checkpoint"] == evaluated["checkpoint"]
    assert run.data.tags["tideflow.checkpoint_step"] == str(best.step)
    assert run.data.tags["tideflow.checkpoint_choice"] == "best"

    promoted = outputs["promote"]
    assert promoted["decision"] == "promoted" and promoted["version"] == "1"
    assert promoted["model_uri"] == "models:/digits-classifier@champion"
    champion = client.get_model_version_by_alias("digits-classifier", "champion")
    assert str(champion.version) == "1"
    assert champion.tags["tideflow.checkpoint"] == evaluated["checkpoint"]
    assert champion.tags["tideflow.checkpoint_step"] == str(best.step)
    assert champion.tags["tideflow.checkpoint_selected"] == "best"
    assert champion.tags["tideflow.training_task"] == "train"
    assert_champion_states_its_requirements_and_loads_without_tideflow(
        client, champion.source, tmp_path / "mlflow.db"
    )

    # A retried promotion (same workflow run) registers nothing new and moves nothing.
    again = run_task(
        workflow, "promote", tmp_path / "again", done=outputs, workflow_name=WORKFLOW, env=env
    )
    assert again["decision"] == "promoted" and again["version"] == "1"
    assert len(client.search_model_versions("name = 'digits-classifier'")) == 1


def assert_champion_states_its_requirements_and_loads_without_tideflow(
    client: Any, source: str, db: Path
) -> None:
    """The example's builder states what loading the model needs (torch, mlflow,
    cloudpickle), not what importing it happened to load (transformers, lightning, ...
    in a shared environment); and the champion, ``source``, loads and predicts where
    tideflow, Lightning and transformers cannot be imported, as in a serving image
    built from those requirements (MLflow saves it as a torch.export program)."""
    from mlflow.artifacts import download_artifacts

    logged = client.get_logged_model(source.removeprefix("models:/"))
    requirements = Path(download_artifacts(f"{logged.artifact_location}/requirements.txt"))
    names = sorted(line.split("==")[0] for line in requirements.read_text().split())
    assert names == ["cloudpickle", "mlflow", "torch"], names
    serving = subprocess.run(
        [sys.executable, "-c", PREDICT_WITHOUT_TIDEFLOW, source],
        env={**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{db}"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert serving.returncode == 0, serving.stderr[-3000:]
    assert serving.stdout.strip() == "(3, 10)"


@pytest.mark.processes
def test_the_exit_handler_closes_a_failed_workflows_run_as_failed(
    tmp_path: Path, tracking: str
) -> None:
    from mlflow.tracking import MlflowClient

    workflow, env = compiled(tmp_path)
    run_task(workflow, "prepare-data", tmp_path / "out", done={}, workflow_name=WORKFLOW, env=env)
    # the training step failed, say: Argo runs the exit handler with that status
    run_exit_handler(workflow, tmp_path / "out", workflow_name=WORKFLOW, env=env, status="Failed")
    client = MlflowClient(tracking_uri=tracking)
    experiment = client.get_experiment_by_name("digits")
    (parent,) = client.search_runs(
        [experiment.experiment_id], "tags.`tideflow.kind` = 'pipeline-run'"
    )
    assert parent.info.status == "FAILED" and parent.data.tags["tideflow.dag_run_id"] == WORKFLOW


def executor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tideflow.steps.standalone", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        timeout=300,
        check=False,
    )


@pytest.mark.processes
def test_a_failing_entry_point_fails_the_step_with_its_last_lines(tmp_path: Path) -> None:
    config = {"entrypoint": "tests.step_entrypoints:boom", "args": {}, "outputs": ["out"]}
    common = ["--pipeline", "p", "--team", "qa", "--step", "prep", "--run-id", "r"]
    done = executor(
        "data_prep",
        *common,
        "--config",
        json.dumps(config),
        "--set",
        "args/reason:str=broken on purpose",
        "--outputs",
        str(tmp_path),
        env={"MLFLOW_TRACKING_URI": ""},
    )
    assert done.returncode == 1
    assert "entry point tests.step_entrypoints:boom exited with code 1" in done.stderr
    assert "broken on purpose" in done.stderr and not list(tmp_path.iterdir())
    bad = executor("data_prep", *common, "--config", "[]", "--outputs", str(tmp_path))
    assert bad.returncode == 2 and "--config is not a JSON object" in bad.stderr


@pytest.mark.processes
def test_no_checkpoint_in_the_store_fails_the_evaluation(tmp_path: Path) -> None:
    config = {"entrypoint": "tests.step_entrypoints:report_device", "args": {}, "metrics": ["x"]}
    done = executor(
        "evaluation",
        *["--pipeline", "p", "--team", "qa", "--step", "evaluate", "--run-id", "r"],
        "--config",
        json.dumps(config),
        "--checkpoint-store",
        (tmp_path / "empty").as_uri(),
        "--outputs",
        str(tmp_path / "out"),
    )
    assert done.returncode == 1
    assert f"no committed checkpoint in {(tmp_path / 'empty').as_uri()}" in done.stderr


SCORES = (0.93, 0.951, 0.944)  # steps 10, 20, 30: the run peaked at step 20
COMMON = ["--pipeline", "p", "--team", "qa", "--run-id", "r"]


def scored_store(tmp_path: Path) -> str:
    """A gang's file store with steps 10, 20, 30 committed, scored SCORES by val_accuracy."""
    from tideflow.checkpoint import CheckpointManager

    uri = (tmp_path / "checkpoints").as_uri()
    manager = CheckpointManager(uri)
    for index, score in enumerate(SCORES):
        step = 10 * (index + 1)
        manager.save(step, {"model.pt": f"weights at {step}".encode()}, {"val_accuracy": score})
    return uri


CHOICES = [
    ("best", {"metric": "val_accuracy", "mode": "max"}, 20, "best by val_accuracy (max)"),
    ("best", {"metric": "val_accuracy", "mode": "min"}, 10, "best by val_accuracy (min)"),
    ("latest", {"metric": "val_accuracy", "mode": "max"}, 30, "asks for the latest"),
    ("best", None, 30, "declares no checkpoint.keep_best"),
    ("best", {"metric": "f1", "mode": "max"}, 30, "has a finite f1"),
]


@pytest.mark.parametrize(("choice", "keep_best", "step", "says"), CHOICES)
def test_the_checkpoint_field_names_the_checkpoint_and_says_why(
    tmp_path: Path, choice: str, keep_best: dict[str, str] | None, step: int, says: str
) -> None:
    from tideflow.steps.evaluation import select_checkpoint

    said: list[str] = []
    chosen = select_checkpoint(scored_store(tmp_path), choice, keep_best, log=said.append)
    assert chosen.facts["checkpoint_step"] == step and says in chosen.reason
    assert chosen.selected == ("best" if "best by" in says else "latest")
    assert any(says in line for line in said)  # a fallback to the latest is logged too


# The executor's wiring, once for a best and once for a fallback to the latest: the rules
# between are the test above's.
@pytest.mark.processes
@pytest.mark.parametrize(("choice", "keep_best", "step", "says"), [CHOICES[0], CHOICES[3]])
def test_the_evaluation_executor_scores_the_checkpoint_its_checkpoint_field_names(
    tmp_path: Path,
    tracking: str,
    *,
    choice: str,
    keep_best: dict[str, str] | None,
    step: int,
    says: str,
) -> None:
    """As an Argo step: outputs and the MLflow run say which checkpoint and why; a fallback
    to the latest is logged."""
    from mlflow.tracking import MlflowClient

    config = {
        "entrypoint": "tests.step_entrypoints:score_checkpoint",
        "args": {},
        "metrics": ["accuracy"],
        "checkpoint": choice,
        "keep_best": keep_best,
    }
    done = executor(
        "evaluation",
        *COMMON,
        "--step",
        "evaluate",
        "--config",
        json.dumps(config),
        "--checkpoint-store",
        scored_store(tmp_path),
        "--outputs",
        str(tmp_path / "out"),
        env={"MLFLOW_TRACKING_URI": tracking},
    )
    assert done.returncode == 0, done.stderr
    assert says in done.stdout
    out = {path.name: path.read_text() for path in (tmp_path / "out").iterdir()}
    assert out["checkpoint_step"] == str(step)
    assert out["checkpoint"].endswith(f"/step-{step:012d}/MANIFEST.json")
    assert json.loads(out["metrics"]) == {"accuracy": SCORES[step // 10 - 1]}
    selection = json.loads(out["checkpoint_selection"])
    assert selection["choice"] == choice and selection["step"] == step
    assert selection["selected"] == ("best" if "best by" in says else "latest")
    client = MlflowClient(tracking_uri=tracking)
    (run,) = client.search_runs(
        [client.get_experiment_by_name("p").experiment_id], "tags.`tideflow.step` = 'evaluate'"
    )
    assert run.data.tags["tideflow.checkpoint"] == out["checkpoint"]
    assert run.data.tags["tideflow.checkpoint_step"] == str(step)
    assert run.data.tags["tideflow.checkpoint_choice"] == choice
    assert says in run.data.tags["tideflow.checkpoint_reason"]


def test_a_damaged_best_checkpoint_is_skipped_for_the_next_best(tmp_path: Path) -> None:
    """The best whose shards no longer verify is passed over, saying why; the next best
    (step 30 here) is evaluated."""
    from tideflow.steps.evaluation import select_checkpoint

    store = scored_store(tmp_path)
    shard = tmp_path / "checkpoints" / "step-000000000020" / "model.pt"
    shard.write_bytes(shard.read_bytes().upper())  # same size, other bytes
    said: list[str] = []
    chosen = select_checkpoint(
        store, "best", {"metric": "val_accuracy", "mode": "max"}, log=said.append
    )
    assert chosen.facts["checkpoint_step"] == 30 and chosen.selected == "best"
    assert any("skipping step 20" in line and "SHA-256" in line for line in said)


@pytest.mark.processes
def test_a_gate_metric_the_evaluation_lacks_fails_the_promotion_step(
    tmp_path: Path, tracking: str
) -> None:
    """Exit 1 with the reason (old: exit 0, "not promoted"); the promotion's MLflow run is
    closed FAILED saying why; nothing is registered and no output is written."""
    from mlflow.tracking import MlflowClient

    config = {
        "model": "auc-model",
        "alias": "champion",
        "gate": {"metric": "auc", "mode": "max", "min_delta": 0.0},
        "builder": "tests.step_entrypoints:log_constant_model",
        "args": {},
    }
    done = executor(
        "promote_checkpoint",
        *COMMON,
        "--step",
        "promote",
        "--config",
        json.dumps(config),
        "--checkpoint-store",
        scored_store(tmp_path),
        "--checkpoint-step",
        "20",
        "--metrics",
        json.dumps({"accuracy": 0.951, "loss": 0.049}),
        "--outputs",
        str(tmp_path / "out"),
        env={"MLFLOW_TRACKING_URI": tracking},
    )
    assert done.returncode == 1, done.stdout
    assert "step 'promote' is misconfigured" in done.stderr
    assert "reads metric(s) auc, which the evaluation did not produce" in done.stderr
    assert "(its metrics: accuracy, loss)" in done.stderr
    assert not (tmp_path / "out").exists()
    client = MlflowClient(tracking_uri=tracking)
    (run,) = client.search_runs(
        [client.get_experiment_by_name("p").experiment_id], "tags.`tideflow.step` = 'promote'"
    )
    assert run.info.status == "FAILED" and run.data.tags["tideflow.decision"] == "failed"
    assert not client.search_registered_models("name = 'auc-model'")


def test_filled_in_values_keep_their_types_and_find_their_place() -> None:
    doc: dict[str, Any] = {"args": {"a/b": None, "n": None}, "cmd": ["x", None]}
    for item in ("args/a%2Fb:float=0.5", "args/n:int=7", "cmd/1:str=a=b:c", "new/flag:bool=true"):
        assign(doc, *parse_assignment(item))
    assert doc == {"args": {"a/b": 0.5, "n": 7}, "cmd": ["x", "a=b:c"], "new": {"flag": True}}
    assert read_value("[1, 2]", "json") == [1, 2] and read_value("adam", "json") == "adam"
    with pytest.raises(ValueError, match="not a boolean"):
        read_value("maybe", "bool")
    with pytest.raises(ValueError, match="PATH:TYPE=VALUE"):
        parse_assignment("args/n=7")


def test_every_container_runs_the_executor_or_the_gang_driver(tmp_path: Path) -> None:
    workflow, _ = compiled(tmp_path)
    steps = {name: t for name, t in templates(workflow).items() if "container" in t}
    driver = steps.pop("train")
    assert driver["container"]["command"] == ["python", "-m", "tideflow.gangs.driver"]
    assert driver["container"]["args"][0] == "gang_training"
    for template in steps.values():
        if "container" in template:
            assert template["container"]["command"] == ["python", "-m", "tideflow.steps.standalone"]
            assert template["container"]["args"][0] in (
                "data_prep",
                "evaluation",
                "promote_checkpoint",
                "pipeline_end",
            )
