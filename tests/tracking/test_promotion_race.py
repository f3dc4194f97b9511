"""Exactly one model version per promotion run, with attempts racing in parallel processes.

Four processes promote the same run at the same instant (a barrier releases
them together), twenty rounds in a row, against a real MLflow server whose
registry has no "register if absent", with the registration claim on a real
S3-compatible server (create-only writes). Every round
must end with exactly one registered version for the run, the alias on it,
one "promoted" audit record, and one build of the model.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

PROCESSES = 4
ROUNDS = 20
MODEL = "race-classifier"

pytestmark = [pytest.mark.processes, pytest.mark.servers]


def _build(builder: Any, args: dict[str, Any]) -> dict[str, Any]:
    """A real (tiny) MLflow model logged into the promotion's run; counts its builds."""
    import mlflow
    import mlflow.pyfunc

    class Constant(mlflow.pyfunc.PythonModel):  # type: ignore[misc,name-defined]
        def predict(self, context: Any, model_input: Any) -> Any:
            return [1] * len(model_input)

    with open(os.environ["RACE_BUILDS"], "a") as builds:
        builds.write(f"{args['run_id']}\n")
    with mlflow.start_run(run_id=args["run_id"]):
        # stated, as the example builder does: inferring them imports the model in a process
        info = mlflow.pyfunc.log_model(
            name="model", python_model=Constant(), pip_requirements=["mlflow"]
        )
    return {"model_uri": info.model_uri}


def _attempt(model: str, worker: int, runs: list[str], env: dict[str, str], sync: Any) -> None:
    barrier, out = sync
    os.environ.update(env)
    from tideflow.promotion.promote import PromotionRequest, promote
    from tideflow.promotion.registry import client

    mlflow = client()
    for round_index, run_id in enumerate(runs):
        request = PromotionRequest(
            step="promote",
            model=model,
            alias="champion",
            gate={"metric": "accuracy", "mode": "max", "min_delta": 0.001},
            metrics={"accuracy": 0.5 + 0.01 * round_index},
            trained={"checkpoint": f"s3://ckpt/{run_id}/step-1"},
            run_id=run_id,
            who=f"worker-{worker}",
            artifact_root=env["RACE_ARTIFACT_ROOT"],
            builder="tests:builder",
        )
        barrier.wait(timeout=120)
        try:
            result = promote(mlflow, request, _build, lambda _line: None)
            out.put((round_index, worker, result.outputs.get("version"), None))
        except Exception as exc:  # reported to the parent, which fails the test
            out.put((round_index, worker, None, repr(exc)))


def test_parallel_promotions_register_one_version_per_run(
    mlflow_url: str, s3_endpoint: str, tmp_path: Path
) -> None:
    claims = "s3"
    from mlflow.tracking import MlflowClient

    model = f"{MODEL}-{claims}"
    root = f"s3://tideflow/race-{claims}" if claims == "s3" else (tmp_path / "root").as_uri()
    env = {
        "MLFLOW_TRACKING_URI": mlflow_url,
        "RACE_ARTIFACT_ROOT": root,
        "RACE_BUILDS": str(tmp_path / "builds.txt"),
        "AWS_ENDPOINT_URL_S3": s3_endpoint,
    }
    mlflow = MlflowClient(tracking_uri=mlflow_url)
    experiment = mlflow.create_experiment(f"race-{claims}")
    runs = [mlflow.create_run(experiment).info.run_id for _ in range(ROUNDS)]

    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES)
    out = context.Queue()
    workers = [
        context.Process(target=_attempt, args=(model, worker, runs, env, (barrier, out)))
        for worker in range(PROCESSES)
    ]
    for process in workers:
        process.start()
    results = [out.get(timeout=600) for _ in range(PROCESSES * ROUNDS)]
    for process in workers:
        process.join(timeout=60)
        assert process.exitcode == 0

    errors = [r for r in results if r[3] is not None]
    assert not errors, errors
    for round_index, run_id in enumerate(runs):
        versions = mlflow.search_model_versions(f"name = '{model}' and run_id = '{run_id}'")
        assert len(versions) == 1, (round_index, [v.version for v in versions])
        reported = {r[2] for r in results if r[0] == round_index}
        assert reported == {str(versions[0].version)}, (round_index, reported)
    assert len(mlflow.search_model_versions(f"name = '{model}'")) == ROUNDS
    champion = mlflow.get_model_version_by_alias(model, "champion")
    assert champion.run_id == runs[-1]
    audits = [
        json.loads(value)
        for key, value in mlflow.get_registered_model(model).tags.items()
        if key.startswith("tideflow.audit.")
    ]
    promoted = [a for a in audits if a["what"].startswith("promoted version")]
    assert len(promoted) == ROUNDS, [a["what"] for a in promoted]
    builds = (tmp_path / "builds.txt").read_text().split()
    assert sorted(builds) == sorted(runs), "each run's model must be built exactly once"
