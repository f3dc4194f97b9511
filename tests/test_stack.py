"""The local stack end to end: real SeaweedFS, MLflow and `airflow standalone` on 127.0.0.1.

Starts everything in a temporary TIDEFLOW_HOME, triggers the `digits` pipeline
through Airflow's REST API, checks its outputs in S3, and stops every process
group it started.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tideflow.stack.__main__ import up
from tideflow.stack.airflow_api import AirflowApi
from tideflow.stack.services import StackState, s3_client
from tideflow.storage import safe_segment

pytestmark = pytest.mark.slow
FIRST_RUN: list[str] = []  # the run id of the first digits run, for the promotion tests


def test_digits_runs_through_the_rest_api(stack: StackState) -> None:
    api = AirflowApi(stack.services["airflow"].url, stack.airflow_user, stack.airflow_password)
    api.wait_for_dag("digits", timeout_s=180)
    assert api.import_errors() == []
    api.unpause("digits")
    run_id = api.trigger("digits", {"seed": 5})
    FIRST_RUN.append(run_id)
    assert api.wait_for_run("digits", run_id, timeout_s=600) == "success"
    assert api.task_states("digits", run_id) == {
        "prepare-data": "success",
        "train": "success",
        "evaluate": "success",
        "promote": "success",
    }

    s3 = s3_client(stack)
    listing = s3.list_objects_v2(Bucket="tideflow", Prefix="artifacts/digits/")
    keys = [item["Key"] for item in listing.get("Contents", [])]
    assert sorted(k.rsplit("/", 1)[1] for k in keys if "/prepare-data/" in k) == [
        "train.npz",
        "validation.npz",
    ]
    manifests = [k for k in keys if "/train/checkpoints/" in k and k.endswith("MANIFEST.json")]
    assert manifests, keys  # the gang's checkpoints went to S3

    runs = mlflow_search(stack, "digits")
    by_kind = {(r["tags"].get("tideflow.kind"), r["tags"].get("tideflow.step")): r for r in runs}
    parent = by_kind[("pipeline-run", None)]
    train = by_kind[("step", "train")]
    assert by_kind[("step", "prepare-data")]["tags"]["mlflow.parentRunId"] == parent["run_id"]
    assert train["tags"]["mlflow.parentRunId"] == parent["run_id"]
    assert train["metrics"]["final_val_accuracy"] >= 0.95
    assert "loss" in train["metrics"] and train["metrics"]["cpu_hours"] > 0
    assert train["tags"]["tideflow.checkpoint"].startswith("s3://tideflow/artifacts/digits/")
    evaluate = by_kind[("step", "evaluate")]
    assert evaluate["metrics"]["accuracy"] == pytest.approx(
        train["metrics"]["final_val_accuracy"]
    )  # the same checkpoint, verified, re-scored
    assert evaluate["tags"]["tideflow.device"] == "cpu (cpu)"

    # Each task's "MLflow run" extra link opens that step's nested run.
    experiment_id = train["experiment_id"]
    mlflow_url = stack.services["mlflow"].url
    for task_id in ("prepare-data", "train", "evaluate", "promote"):
        link = api.extra_links("digits", run_id, task_id)["MLflow run"]
        step_run = by_kind[("step", task_id)]["run_id"]
        assert link == f"{mlflow_url}/#/experiments/{experiment_id}/runs/{step_run}"


def mlflow_search(stack: StackState, experiment: str) -> list[dict[str, object]]:
    url = stack.services["mlflow"].url

    def post(path: str, body: dict[str, object]) -> dict[str, object]:
        request = urllib.request.Request(
            f"{url}{path}",
            method="POST",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return dict(json.loads(response.read()))

    with urllib.request.urlopen(
        f"{url}/api/2.0/mlflow/experiments/get-by-name?experiment_name={experiment}", timeout=30
    ) as response:
        experiment_id = json.loads(response.read())["experiment"]["experiment_id"]
    found = post("/api/2.0/mlflow/runs/search", {"experiment_ids": [experiment_id]})
    runs = []
    for run in found.get("runs", []):  # type: ignore[union-attr]
        data = run["data"]
        runs.append(
            {
                "run_id": run["info"]["run_id"],
                "experiment_id": run["info"]["experiment_id"],
                "tags": {t["key"]: t["value"] for t in data.get("tags", [])},
                "metrics": {m["key"]: m["value"] for m in data.get("metrics", [])},
            }
        )
    return runs


def test_mlflow_server_stores_runs_with_artifacts_in_s3(stack: StackState) -> None:
    url = stack.services["mlflow"].url
    request = urllib.request.Request(
        f"{url}/api/2.0/mlflow/experiments/create",
        method="POST",
        data=json.dumps({"name": "stack-test"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        experiment_id = json.loads(response.read())["experiment_id"]
    with urllib.request.urlopen(
        f"{url}/api/2.0/mlflow/experiments/get?experiment_id={experiment_id}", timeout=30
    ) as response:
        experiment = json.loads(response.read())["experiment"]
    assert experiment["artifact_location"].startswith("mlflow-artifacts:")


def registry_state(stack: StackState) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """(versions of digits-classifier, aliases -> version) through MLflow's REST API."""
    url = stack.services["mlflow"].url
    request = urllib.request.Request(
        f"{url}/api/2.0/mlflow/model-versions/search?filter=name%3D%27digits-classifier%27",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        versions = json.loads(response.read()).get("model_versions", [])
    with urllib.request.urlopen(
        f"{url}/api/2.0/mlflow/registered-models/get?name=digits-classifier", timeout=30
    ) as response:
        model = json.loads(response.read())["registered_model"]
    aliases = {a["alias"]: a["version"] for a in model.get("aliases", [])}
    return versions, aliases


def test_first_run_promoted_version_1_with_lineage(stack: StackState) -> None:
    assert FIRST_RUN, "runs after test_digits_runs_through_the_rest_api"
    versions, aliases = registry_state(stack)
    assert [v["version"] for v in versions] == ["1"] and aliases == {"champion": "1"}
    tags = {t["key"]: t["value"] for t in versions[0]["tags"]}
    assert tags["tideflow.dag_run_id"] == FIRST_RUN[0]
    assert tags["tideflow.checkpoint"].startswith("s3://tideflow/artifacts/digits/")
    assert len(tags["tideflow.checkpoint_checksum"]) == 64
    assert float(tags["tideflow.metric.accuracy"]) >= 0.95


def _get(url: str, token: str | None = None) -> tuple[int, str, str]:
    """(status, body, Location header) of a GET that does not follow redirects."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(request, timeout=60) as response:
            return response.status, response.read().decode(), ""
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace"), exc.headers.get("Location", "")


def test_tideflow_page_needs_a_login_and_shows_runs_champions_and_usage(
    stack: StackState,
) -> None:
    assert FIRST_RUN, "runs after test_digits_runs_through_the_rest_api"
    base = stack.services["airflow"].url
    status, _, location = _get(f"{base}/tideflow/")
    assert status == 303 and "/auth/login" in location  # a browser is sent to log in
    assert _get(f"{base}/tideflow/api/overview")[0] == 401
    assert _get(f"{base}/tideflow/api/overview", "not-a-token")[0] in (401, 403)

    api = AirflowApi(base, stack.airflow_user, stack.airflow_password)
    status, body, _ = _get(f"{base}/tideflow/api/overview", api.token())
    assert status == 200, body
    overview = json.loads(body)
    (digits,) = [p for p in overview["pipelines"] if p["dag_id"] == "digits"]
    assert digits["team"] == "vision"
    first = next(r for r in digits["runs"] if r["run_id"] == FIRST_RUN[0])
    assert first["state"] == "success"
    assert first["mlflow_url"].startswith(stack.services["mlflow"].url + "/#/experiments/")
    (champion,) = [c for c in overview["champions"] if c["model"] == "digits-classifier"]
    assert champion["version"] == "1" and champion["dag_run_id"] == FIRST_RUN[0]
    usage = {(u["team"], u["device_class"]): u["hours"] for u in overview["usage"]}
    assert usage[("vision", "cpu")] > 0  # the 2-worker CPU gang's lease

    status, html, _ = _get(f"{base}/tideflow/", api.token())
    assert status == 200 and "digits-classifier" in html and FIRST_RUN[0] in html

    # The DAG's success callback closes the parent MLflow run (shortly after the run ends).
    deadline = time.monotonic() + 60
    while first["mlflow_status"] != "FINISHED" and time.monotonic() < deadline:
        time.sleep(2)
        overview = json.loads(_get(f"{base}/tideflow/api/overview", api.token())[1])
        first = next(
            r for p in overview["pipelines"] for r in p["runs"] if r["run_id"] == FIRST_RUN[0]
        )
    assert first["mlflow_status"] == "FINISHED"


def test_champion_loads_with_pyfunc_and_predicts_with_the_reported_accuracy(
    stack: StackState, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    import mlflow.pyfunc
    import numpy as np

    monkeypatch.setenv("MLFLOW_TRACKING_URI", stack.services["mlflow"].url)
    model = mlflow.pyfunc.load_model("models:/digits-classifier@champion")
    s3 = s3_client(stack)
    key = f"artifacts/digits/{safe_segment(FIRST_RUN[0])}/prepare-data/validation.npz"
    data = np.load(io.BytesIO(s3.get_object(Bucket="tideflow", Key=key)["Body"].read()))
    accuracy = float((np.asarray(model.predict(data["x"])).argmax(axis=1) == data["y"]).mean())
    versions, _ = registry_state(stack)
    tags = {t["key"]: t["value"] for t in versions[0]["tags"]}
    assert accuracy == pytest.approx(float(tags["tideflow.metric.accuracy"]))


def test_bad_learning_rate_is_rejected_and_a_rerun_changes_nothing(stack: StackState) -> None:
    api = AirflowApi(stack.services["airflow"].url, stack.airflow_user, stack.airflow_password)
    bad = api.trigger("digits", {"lr": 0.00001, "epochs": 1})
    assert api.wait_for_run("digits", bad, timeout_s=600) == "success"
    versions, aliases = registry_state(stack)
    assert [v["version"] for v in versions] == ["1"] and aliases == {"champion": "1"}
    runs = mlflow_search(stack, "digits")
    rejected = [
        r
        for r in runs
        if r["tags"].get("tideflow.step") == "promote"
        and r["tags"].get("tideflow.dag_run_id") == bad
    ]
    assert rejected and rejected[0]["tags"]["tideflow.decision"] == "rejected"
    assert "below the threshold" in rejected[0]["tags"]["tideflow.reason"]
    # run the first run's promotion again: no new version, the alias stays
    api.clear_task("digits", FIRST_RUN[0], "promote")
    assert api.wait_for_run("digits", FIRST_RUN[0], timeout_s=300) == "success"
    versions, aliases = registry_state(stack)
    assert [v["version"] for v in versions] == ["1"] and aliases == {"champion": "1"}


def test_metrics_logged_during_an_mlflow_outage_arrive_later(
    stack: StackState, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tideflow.runtime.metrics import MetricsLogger, flush_spool, spool_path
    from tideflow.stack.processes import free_port

    url = stack.services["mlflow"].url

    def call(path: str, body: dict[str, object] | None = None) -> dict[str, object]:
        request = urllib.request.Request(
            f"{url}{path}",
            method="POST" if body is not None else "GET",
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return dict(json.loads(response.read()))

    experiment = call("/api/2.0/mlflow/experiments/create", {"name": "outage"})
    run = call("/api/2.0/mlflow/runs/create", {"experiment_id": experiment["experiment_id"]})
    run_id = str(run["run"]["info"]["run_id"])  # type: ignore[index]
    monkeypatch.setenv("TIDEFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")  # down
    logger = MetricsLogger(is_main=True, run_id=run_id, retry_s=0.2)
    for step in range(5):
        logger.log_metrics({"loss": 1.0 / (step + 1)}, step)  # training is never blocked
    logger.close(timeout_s=10)
    assert len(spool_path(run_id).read_text().splitlines()) == 5
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)  # the server is back
    assert flush_spool(run_id) == 5
    history = call(f"/api/2.0/mlflow/metrics/get-history?run_id={run_id}&metric_key=loss")
    assert [m["step"] for m in history["metrics"]] == [0, 1, 2, 3, 4]  # type: ignore[index]
    assert not spool_path(run_id).exists()


def test_up_is_idempotent(stack: StackState) -> None:
    again = up(Path(stack.home))
    assert {k: v.pid for k, v in again.services.items()} == {
        k: v.pid for k, v in stack.services.items()
    }
