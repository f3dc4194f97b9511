"""The local stack end to end: real SeaweedFS, MLflow and Airflow's components on 127.0.0.1.

Starts everything in a temporary TIDEFLOW_HOME as ``make demo`` does (the lab's
teams and the broker; ``tests/stack/conftest.py``), triggers the `digits` pipeline
through Airflow's REST API, checks its outputs in S3, and stops every process
group it started.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tideflow.checkpoint.manifest import decode
from tideflow.stack.__main__ import up
from tideflow.stack.airflow_api import AirflowApi
from tideflow.stack.services import StackState, s3_client
from tideflow.storage import safe_segment

pytestmark = pytest.mark.servers
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
    # checkpoint: best (the default): the checkpoint best by the gang's keep_best
    # (val_accuracy, max; of equals the earliest), re-scored
    scored = {}
    for key in manifests:
        step = int(key.rsplit("/step-", 1)[1].split("/")[0])
        body = s3.get_object(Bucket="tideflow", Key=key)["Body"].read()
        metrics = decode(body, key, step).metrics
        if "val_accuracy" in metrics:
            scored[step] = metrics["val_accuracy"]
    best = min(scored, key=lambda step: (-scored[step], step))
    assert evaluate["tags"]["tideflow.checkpoint_step"] == str(best)
    assert evaluate["tags"]["tideflow.checkpoint_selected"] == "best"
    assert evaluate["tags"]["tideflow.checkpoint"].endswith(f"/step-{best:012d}/MANIFEST.json")
    assert evaluate["metrics"]["accuracy"] >= 0.9
    # devices: [npu, gpu-spare, cpu]: the lab has no NPU, and a GPU no lease holds
    assert evaluate["tags"]["tideflow.device"].endswith(" (gpu-spare, emulated on the CPU)")

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
    assert tags["tideflow.checkpoint_choice"] == "best"  # the evaluated checkpoint
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
    from tideflow.runtime.metrics import MetricsLogger
    from tideflow.stack.processes import free_port
    from tideflow.tracking.spool import flush_spool, spool_path

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


def test_task_logs_are_read_from_the_log_folder_without_log_servers(stack: StackState) -> None:
    """The scheduler and triggerer run without their log servers; the UI's logs still come."""
    assert FIRST_RUN, "runs after test_digits_runs_through_the_rest_api"
    api = AirflowApi(stack.services["airflow"].url, stack.airflow_user, stack.airflow_password)
    folder = str(Path(stack.home) / "airflow" / "logs")
    for task_id in ("prepare-data", "train", "evaluate", "promote"):
        events = api.task_log("digits", FIRST_RUN[0], task_id)
        assert any(event.startswith(folder) for event in events), events[:10]
        assert not any("Could not read served logs" in event for event in events)
        assert len(events) > 5, events


def test_up_is_idempotent(stack: StackState) -> None:
    again = up(Path(stack.home))
    assert {k: v.pid for k, v in again.services.items()} == {
        k: v.pid for k, v in stack.services.items()
    }


# --- what the stack exposes: files, listeners, credentials ---------------------------------

SECRET_FILES = ("stack.json", "airflow-passwords.json", "s3-identities.json")


def test_files_holding_secrets_are_private_to_the_user(stack: StackState) -> None:
    home = Path(stack.home)
    assert home.stat().st_mode & 0o077 == 0, oct(home.stat().st_mode)  # no group/other access
    for name in SECRET_FILES:
        mode = (home / name).stat().st_mode & 0o777
        assert mode == 0o600, f"{name}: {oct(mode)}"
    assert stack.airflow_password in (home / "stack.json").read_text()  # what needs hiding


def test_state_is_written_private_whatever_the_umask(tmp_path: Path) -> None:
    state = StackState(str(tmp_path / "home"), airflow_password="hunter2")
    state.path.parent.mkdir()
    state.path.write_text("{}")  # an older, world-readable file is replaced, not reused
    state.path.chmod(0o644)
    old = os.umask(0)
    try:
        state.save()
    finally:
        os.umask(old)
    assert state.path.stat().st_mode & 0o777 == 0o600
    assert StackState.load(Path(state.home)) == state
    assert [p.name for p in Path(state.home).iterdir()] == ["stack.json"]  # no temp file left


def _listening_sockets() -> dict[int, tuple[str, int]]:
    """Socket inode -> (address, port) of every listening TCP socket, IPv4 and IPv6."""
    import ipaddress

    found: dict[int, tuple[str, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            hex_address, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_address)
            # the kernel prints each 32-bit word in host (little-endian) order
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found[int(fields[9])] = (str(ipaddress.ip_address(words)), int(hex_port, 16))
    return found


def _stack_listeners(stack: StackState) -> dict[str, list[tuple[str, int, str]]]:
    """Service -> (address, port, command) of each socket its processes listen on.

    A process belongs to a service when its process group or session is the
    one the service was started as.
    """
    sockets = _listening_sockets()
    leaders = {service.pid: name for name, service in stack.services.items()}
    listeners: dict[str, list[tuple[str, int, str]]] = {name: [] for name in stack.services}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            fds = list((entry / "fd").iterdir())
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:80]
        except OSError:
            continue
        name = leaders.get(int(fields[2])) or leaders.get(int(fields[3]))
        if name is None:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and int(target[8:-1]) in sockets:
                address, port = sockets[int(target[8:-1])]
                listeners[name].append((address, port, command))
    return listeners


def test_every_listener_of_the_stack_is_on_loopback_on_a_port_of_its_own(
    stack: StackState,
) -> None:
    listeners = _stack_listeners(stack)
    assert all(listeners.values()), listeners  # each service was found listening
    exposed = [
        (name, *listener)
        for name, found in listeners.items()
        for listener in found
        if listener[0] not in ("127.0.0.1", "::1")
    ]
    assert exposed == []
    # Fixed default ports would collide with a second stack (a test's beside the
    # developer's): Airflow's log servers, SeaweedFS's servers, MLflow, the API server.
    defaults = {8793, 8794, 8181, 9101, 8333, 9333, 8888, 9340, 23646, 7333, 5000, 8080}
    fixed = [
        (name, *listener)
        for name, found in listeners.items()
        for listener in found
        if listener[1] in defaults
    ]
    assert fixed == []


def test_s3_refuses_anonymous_and_wrong_credentials(stack: StackState) -> None:
    import uuid

    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import ClientError

    url = stack.services["s3"].url
    env = stack.client_env()
    assert env["AWS_SECRET_ACCESS_KEY"] != "tideflow-local"  # generated, not a placeholder
    key = f"exposure/{uuid.uuid4().hex}"

    def refused(client: Any) -> str:
        with pytest.raises(ClientError) as caught:
            client.put_object(Bucket="tideflow", Key=key, Body=b"x")
        assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        return str(caught.value.response["Error"]["Code"])

    def client(**kwargs: Any) -> Any:
        return boto3.client("s3", endpoint_url=url, region_name="us-east-1", **kwargs)

    assert refused(client(config=Config(signature_version=UNSIGNED))) == "AccessDenied"
    wrong_secret = client(
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key="not-the-secret"
    )
    assert refused(wrong_secret) == "SignatureDoesNotMatch"
    unknown_key = client(aws_access_key_id="AKIAUNKNOWN", aws_secret_access_key="whatever")
    assert refused(unknown_key) == "InvalidAccessKeyId"
    request = urllib.request.Request(f"{url}/tideflow/{key}", data=b"x", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as plain:
        urllib.request.urlopen(request, timeout=30)
    assert plain.value.code == 403
    anonymous = client(config=Config(signature_version=UNSIGNED))
    with pytest.raises(ClientError):
        anonymous.list_objects_v2(Bucket="tideflow")

    s3 = s3_client(stack)  # the generated credentials work
    s3.put_object(Bucket="tideflow", Key=key, Body=b"signed")
    assert s3.get_object(Bucket="tideflow", Key=key)["Body"].read() == b"signed"
    s3.delete_object(Bucket="tideflow", Key=key)


def test_no_port_of_the_s3_server_takes_an_anonymous_write_into_a_bucket(
    stack: StackState,
) -> None:
    """SeaweedFS's filer (and a WebDAV gateway, if any) writes bucket files over plain HTTP."""
    import http.client
    import uuid

    from botocore.exceptions import ClientError

    ports = sorted({port for _, port, _ in _stack_listeners(stack)["s3"]})
    assert len(ports) >= 4, ports
    s3 = s3_client(stack)
    for port in ports:
        key = f"exposure/anonymous-{port}-{uuid.uuid4().hex}"
        for method in ("PUT", "POST"):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                connection.request(method, f"/buckets/tideflow/{key}", body=b"anonymous")
                connection.getresponse().read()
            except (OSError, http.client.HTTPException):
                pass  # a gRPC port hangs up on HTTP/1.1: nothing written
            finally:
                connection.close()
        with pytest.raises(ClientError) as caught:
            s3.head_object(Bucket="tideflow", Key=key)
        assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404, port


def test_mlflow_refuses_foreign_host_headers_and_cross_site_writes(stack: StackState) -> None:
    """MLflow has no login locally (see the README); loopback, Host and Origin checks guard it."""
    url = stack.services["mlflow"].url

    def create(headers: dict[str, str]) -> int:
        request = urllib.request.Request(
            f"{url}/api/2.0/mlflow/experiments/create",
            method="POST",
            data=json.dumps({"name": f"cross-site-{time.monotonic_ns()}"}).encode(),
            headers={"Content-Type": "application/json", **headers},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    assert create({"Host": "attacker.example"}) == 403  # DNS rebinding
    assert create({"Origin": "https://attacker.example"}) == 403  # a web page's form or fetch
