"""The promotion gate: a table of decisions, then what a promotion does with them.

The table: thresholds, champion comparison, direction, ties, non-finite values.
A gate metric the challenger was not scored on is a misconfiguration, never a
rejection. Then ``promote`` against a real MLflow server (registry included)
with real checkpoints in a file store: an identical model registers nothing,
and a gate metric the evaluation lacks fails before the registry is touched.
Last, whole pipelines through Airflow's ``dag.test()`` on that server: the
version promoted is the checkpoint the evaluation chose, and a gate metric the
evaluation lacks fails the promote task at once, without its retries.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.scored_runs import run_pipeline, scored_pipeline, step_run, xcom_of
from tideflow.promotion import GateConfigError, decide

GATE = {
    "metric": "accuracy",
    "mode": "max",
    "min_delta": 0.01,
    "thresholds": {"accuracy": {"min": 0.9}, "loss": {"max": 0.5}},
}
TIE = {"metric": "accuracy", "mode": "max", "min_delta": 0.0}


@pytest.mark.parametrize(
    ("metrics", "gate", "champion", "promote", "says"),
    [
        ({"accuracy": 0.95, "loss": 0.2}, GATE, None, True, "no champion yet"),
        ({"accuracy": 0.95, "loss": 0.2}, GATE, {"accuracy": 0.93}, True, "beats the champion"),
        ({"accuracy": 0.935, "loss": 0.2}, GATE, {"accuracy": 0.93}, False, "does not beat"),
        ({"accuracy": 0.85, "loss": 0.2}, GATE, None, False, "below the threshold 0.9000"),
        ({"accuracy": 0.95, "loss": 0.9}, GATE, None, False, "loss 0.9000 is above"),
        (
            {"loss": 0.20},
            {"metric": "loss", "mode": "min", "min_delta": 0.05},
            {"loss": 0.30},
            True,
            "beats",
        ),
        (
            {"loss": 0.28},
            {"metric": "loss", "mode": "min", "min_delta": 0.05},
            {"loss": 0.30},
            False,
            "does not beat",
        ),
        # a tie never promotes: with min_delta 0 the challenger must be strictly better
        ({"accuracy": 0.9551}, TIE, {"accuracy": 0.9551}, False, "a tie never promotes"),
        ({"accuracy": 0.9552}, TIE, {"accuracy": 0.9551}, True, "needed more than 0.0000"),
        ({"loss": 0.3}, {**TIE, "metric": "loss", "mode": "min"}, {"loss": 0.3}, False, "tie"),
        # a margin of exactly min_delta is a tie too (0.96 - 0.95 is 0.010000000000000009)
        ({"accuracy": 0.96, "loss": 0.2}, GATE, {"accuracy": 0.95}, False, "a tie never"),
        ({"accuracy": 0.9601, "loss": 0.2}, GATE, {"accuracy": 0.95}, True, "beats"),
        # a score that is not a number passes no threshold and beats nothing
        ({"accuracy": float("nan"), "loss": 0.2}, GATE, None, False, "not a finite number"),
        ({"accuracy": 0.95, "loss": float("nan")}, GATE, None, False, "loss is nan"),
    ],
)
def test_gate(
    metrics: dict[str, float],
    gate: dict[str, Any],
    champion: dict[str, float] | None,
    promote: bool,
    says: str,
) -> None:
    decision = decide(metrics, gate, champion)
    assert decision.promote is promote
    assert says in decision.summary


@pytest.mark.parametrize(
    ("metrics", "missing"),
    [
        ({"loss": 0.2}, ("accuracy",)),  # the gate metric
        ({"accuracy": 0.95}, ("loss",)),  # a threshold's
        ({}, ("accuracy", "loss")),
    ],
)
def test_a_metric_the_gate_reads_but_the_challenger_lacks_is_a_misconfiguration(
    metrics: dict[str, float], missing: tuple[str, ...]
) -> None:
    with pytest.raises(GateConfigError) as caught:
        decide(metrics, GATE, {"accuracy": 0.5})
    assert caught.value.missing == missing
    assert f"reads metric(s) {', '.join(missing)}, which the evaluation did not produce" in str(
        caught.value
    )
    assert f"(its metrics: {', '.join(sorted(metrics)) or 'none'})" in str(caught.value)


# -- promote() against a real MLflow server --------------------------------------------------


def _build(builder: Any, args: dict[str, Any]) -> dict[str, Any]:
    """A real (tiny) MLflow model logged into the promotion's run."""
    import mlflow
    import mlflow.pyfunc

    class Constant(mlflow.pyfunc.PythonModel):  # type: ignore[misc,name-defined]
        def predict(self, context: Any, model_input: Any) -> Any:
            return [1] * len(model_input)

    with mlflow.start_run(run_id=args["run_id"]):
        # stated, as the example builder does: inferring them imports the model in a process
        info = mlflow.pyfunc.log_model(
            name="model", python_model=Constant(), pip_requirements=["mlflow"]
        )
    return {"model_uri": info.model_uri}


def _checkpoint(store: Path, step: int, accuracy: float) -> dict[str, Any]:
    """A real committed checkpoint in a file store, as the gang's outputs describe it."""
    from tideflow.checkpoint import CheckpointManager

    manifest = CheckpointManager(store.as_uri()).save(
        step, {"model.pt": f"weights at {step}".encode()}, {"val_accuracy": accuracy}
    )
    return {
        "checkpoint": manifest.uri,
        "checkpoint_store": store.as_uri(),
        "checkpoint_step": manifest.step,
        "checkpoint_checksum": manifest.checksum,
    }


@pytest.fixture
def registry(mlflow_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_url)
    return MlflowClient(tracking_uri=mlflow_url)


def _request(client: Any, tmp_path: Path, model: str, gate: dict[str, Any], **fields: Any) -> Any:
    from tideflow.promotion.promote import PromotionRequest

    experiment = client.get_experiment_by_name(model) or client.get_experiment(
        client.create_experiment(model)
    )
    return PromotionRequest(
        step="promote",
        model=model,
        alias="champion",
        gate=gate,
        run_id=client.create_run(experiment.experiment_id).info.run_id,
        who="test",
        artifact_root=(tmp_path / "artifacts").as_uri(),
        builder="tests:builder",
        **fields,
    )


@pytest.mark.servers
def test_an_identical_model_is_not_promoted_again(registry: Any, tmp_path: Path) -> None:
    """The same score as the champion's with min_delta 0 registers no second version; the
    rejection and the comparison are recorded on the promotion's run; a strictly better
    score still promotes."""
    from tideflow.promotion.promote import promote

    model, store = "tie-classifier", tmp_path / "checkpoints"
    lines: list[str] = []
    first = _request(
        registry,
        tmp_path,
        model,
        TIE,
        metrics={"accuracy": 0.9551},
        trained=_checkpoint(store, 10, 0.9551),
    )
    assert promote(registry, first, _build, lines.append).outputs["version"] == "1"

    again = _request(
        registry,
        tmp_path,
        model,
        TIE,
        metrics={"accuracy": 0.9551},
        trained=_checkpoint(store, 20, 0.9551),
    )
    result = promote(registry, again, _build, lines.append)
    assert result.outputs["decision"] == "rejected"
    assert "a tie never promotes" in result.outputs["reason"]
    assert result.run_tags is not None and result.run_tags["tideflow.decision"] == "rejected"
    assert '"margin": 0.0' in result.run_tags["tideflow.compared"]
    assert result.run_tags["tideflow.checkpoint_step"] == "20"
    assert len(registry.search_model_versions(f"name = '{model}'")) == 1
    assert str(registry.get_model_version_by_alias(model, "champion").version) == "1"

    better = _request(
        registry,
        tmp_path,
        model,
        TIE,
        metrics={"accuracy": 0.9552},
        trained=_checkpoint(store, 30, 0.9552),
    )
    assert promote(registry, better, _build, lines.append).outputs["version"] == "2"
    assert str(registry.get_model_version_by_alias(model, "champion").version) == "2"


@pytest.mark.servers
def test_a_gate_metric_the_evaluation_lacks_fails_the_promotion(
    registry: Any, tmp_path: Path
) -> None:
    """Not a rejection: a final PromotionError naming the metric and the ones there are,
    before anything is written to the registry."""
    from mlflow.exceptions import MlflowException

    from tideflow.promotion.promote import PromotionError, promote

    model = "misconfigured-classifier"
    request = _request(
        registry,
        tmp_path,
        model,
        {"metric": "auc", "mode": "max", "min_delta": 0.0},
        metrics={"accuracy": 0.9551, "loss": 0.1},
        trained=_checkpoint(tmp_path / "checkpoints", 10, 0.9551),
    )
    with pytest.raises(PromotionError) as caught:
        promote(registry, request, _build, lambda _line: None)
    assert caught.value.final
    assert "step 'promote' is misconfigured" in str(caught.value)
    assert "reads metric(s) auc, which the evaluation did not produce" in str(caught.value)
    assert "(its metrics: accuracy, loss)" in str(caught.value)
    with pytest.raises(MlflowException):
        registry.get_registered_model(model)


# -- through Airflow -------------------------------------------------------------------------


def promote_step(model: str, gate: str, retries: int = 0) -> str:
    return (
        "  - name: promote\n"
        "    needs: [evaluate]\n"
        f"    retries: {retries}\n"
        "    promote_checkpoint:\n"
        f"      model: {model}\n"
        "      builder: tests.step_entrypoints:log_constant_model\n"
        f"      gate: {gate}\n"
    )


@pytest.mark.processes
@pytest.mark.servers
@pytest.mark.usefixtures("airflow_home")
def test_airflow_promotes_the_checkpoint_the_evaluation_chose(
    registry: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gang's newest checkpoint is step 30, its best by keep_best step 20: the evaluation
    (checkpoint: best by default) scores step 20, and the version registered is step 20,
    tagged with how it was chosen, as the promotion's run is."""
    model = "best-of-gang"
    gate = "{metric: accuracy, thresholds: {accuracy: {min: 0.9}}}"
    path = scored_pipeline(tmp_path, "promote-best", tail=promote_step(model, gate))
    dag_run = run_pipeline(path, monkeypatch)
    assert str(dag_run.state) == "success"
    evaluated = xcom_of(dag_run, "evaluate")
    assert evaluated["checkpoint_step"] == 20
    assert xcom_of(dag_run, "train")["checkpoint_step"] == 30
    assert xcom_of(dag_run, "promote")["decision"] == "promoted"

    version = registry.get_model_version_by_alias(model, "champion")
    tags = version.tags
    assert tags["tideflow.checkpoint"] == evaluated["checkpoint"]
    assert tags["tideflow.checkpoint"].endswith("/step-000000000020/MANIFEST.json")
    assert tags["tideflow.checkpoint_checksum"] == evaluated["checkpoint_checksum"]
    assert tags["tideflow.checkpoint_step"] == "20"
    assert tags["tideflow.checkpoint_choice"] == "best"
    assert tags["tideflow.checkpoint_selected"] == "best"
    assert "best by val_accuracy (max): 0.9510 at step 20" in tags["tideflow.checkpoint_reason"]
    assert tags["tideflow.metric.accuracy"] == "0.951"
    run = step_run("promote-best", "promote", dag_run.run_id)
    assert run.data.tags["tideflow.checkpoint_step"] == "20"
    assert run.data.tags["tideflow.checkpoint_choice"] == "best"
    # the copy kept out of retention's reach is that checkpoint too
    audits = [
        json.loads(value)
        for key, value in registry.get_registered_model(model).tags.items()
        if key.startswith("tideflow.audit.")
    ]
    (promoted,) = [a for a in audits if a["what"].startswith("promoted version")]
    assert promoted["checkpoint_step"] == 20
    from tideflow.checkpoint import CheckpointManager

    (copied,) = CheckpointManager(promoted["promoted_copy"].rsplit("/step-", 1)[0]).committed()
    assert copied.step == 20 and copied.meta["source"] == evaluated["checkpoint"]


@pytest.mark.processes
@pytest.mark.servers
@pytest.mark.usefixtures("airflow_home")
def test_airflow_fails_a_gate_metric_the_evaluation_lacks_without_retrying(
    registry: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A templated gate metric passes validate; at run time 'auc' is not among the
    evaluation's metrics: the task fails (AirflowFailException: its 2 retries unused), the
    promotion's run is closed FAILED with the reason, and the registry is untouched."""
    from mlflow.exceptions import MlflowException

    model = "misconfigured-gate"
    path = scored_pipeline(
        tmp_path,
        "promote-auc",
        tail=promote_step(model, '{metric: "{{ params.gate_metric }}"}', retries=2),
    )
    path.write_text(
        path.read_text().replace(
            "steps:\n", "params:\n  gate_metric: {type: string, default: auc}\nsteps:\n", 1
        )
    )
    dag_run = run_pipeline(path, monkeypatch)
    assert str(dag_run.state) == "failed"
    (promote,) = [ti for ti in dag_run.get_task_instances() if ti.task_id == "promote"]
    assert str(promote.state) == "failed" and promote.try_number == 1
    assert xcom_of(dag_run, "evaluate")["metrics"].keys() == {"accuracy", "loss"}
    run = step_run("promote-auc", "promote", dag_run.run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["tideflow.decision"] == "failed"
    assert (
        "reads metric(s) auc, which the evaluation did not produce"
        in run.data.tags["tideflow.reason"]
    )
    with pytest.raises(MlflowException):
        registry.get_registered_model(model)
