"""GangTrainingOperator with ``TIDEFLOW_BACKEND=kubernetes``, through Airflow's real ``dag.test()``.

The pipeline file is the same one that runs locally: only configuration sends
its gang step to the cluster. No API server (or Volcano/Kueue controller) can
run here, so the operator (official ``kubernetes`` client) and its trigger
(``kubernetes_asyncio`` watch), configured by a kubeconfig or an Airflow
connection, talk to an HTTP-level fake of the Kubernetes API on 127.0.0.1
that plays the controller: a gang object it is asked for is listed in its
first state, and a watch on it streams the later ones (Pending -> Running ->
Completed for a Volcano Job; Suspended -> active -> Completed for a JobSet).
The first watch is answered 410 Gone, as a server does after compaction.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import textwrap
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.crd_schema import SCHEMAS, crd_schema, validate
from tests.fake_kube import JsonHandler
from tests.test_gang_operator import run_dag, states
from tideflow.kube.settings import kube_settings_from_env

JOBS = (
    r"/apis/(batch\.volcano\.sh/v1alpha1|jobset\.x-k8s\.io/v1alpha2)/namespaces/ml/(jobs|jobsets)"
)


VOLCANO = [{"state": {"phase": p}} for p in ("Pending", "Running", "Completed")]
JOBSET = [
    {"conditions": [{"type": "Suspended", "status": "True"}]},  # waiting for Kueue
    {"replicatedJobsStatus": [{"name": "worker", "active": 1}]},
    {"conditions": [{"type": "Completed", "status": "True"}]},
]


class Cluster:
    """Objects and the status each goes through; the fake plays the controller."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.step: dict[str, int] = {}
        self.posts: list[str] = []
        self.watches = 0
        self.gone_once = False  # answer the first watch with 410 Gone (compacted)

    def current(self, name: str) -> dict[str, Any]:
        obj = self.objects[name]
        script = VOLCANO if obj["kind"] == "Job" else JOBSET
        status = script[min(self.step[name], len(script) - 1)]
        return (
            obj
            | {"metadata": {**obj["metadata"], "resourceVersion": str(self.step[name])}}
            | {"status": status}
        )


def handler_for(cluster: Cluster) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server names
            path, body = self.path.split("?", 1)[0], self._body()
            if not re.fullmatch(JOBS, path):
                return self._send(404, {"kind": "Status", "code": 404})
            cluster.posts.append(path)
            name = body["metadata"]["name"]
            cluster.objects[name] = body
            cluster.step[name] = 0
            return self._send(201, cluster.current(name))

        def do_DELETE(self) -> None:  # noqa: N802 - http.server names
            match = re.fullmatch(JOBS + r"/([\w-]+)", self.path.split("?", 1)[0])
            if not match or cluster.objects.pop(match.group(3), None) is None:
                return self._send(404, {"kind": "Status", "code": 404})
            return self._send(200, {"kind": "Status", "status": "Success"})

        def do_GET(self) -> None:  # noqa: N802 - http.server names
            path, _, query = self.path.partition("?")
            if match := re.fullmatch(JOBS + r"/([\w-]+)", path):  # read one
                name = match.group(3)
                if name not in cluster.objects:
                    return self._send(404, {"kind": "Status", "code": 404})
                return self._send(200, cluster.current(name))
            if not re.fullmatch(JOBS, path):
                return self._send(404, {"kind": "Status", "code": 404})
            args = urllib.parse.parse_qs(query)
            name = args["fieldSelector"][0].removeprefix("metadata.name=")
            if args.get("watch", [""])[0].lower() != "true":  # list: the current state
                items = [cluster.current(name)] if name in cluster.objects else []
                return self._send(200, {"items": items, "metadata": {"resourceVersion": "0"}})
            cluster.watches += 1
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            if not cluster.gone_once:
                cluster.gone_once = True
                gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
                self.wfile.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
                return None
            while name in cluster.objects and cluster.step[name] < 2:  # every later change
                cluster.step[name] += 1
                event = {"type": "MODIFIED", "object": cluster.current(name)}
                self.wfile.write(json.dumps(event).encode() + b"\n")
                self.wfile.flush()
            return None

    return Handler


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    state = Cluster()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_for(state))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "fake",
                        "cluster": {"server": f"http://127.0.0.1:{server.server_port}"},
                    }
                ],
                "users": [{"name": "tester", "user": {"token": "not-a-secret"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester"}}],
                "current-context": "fake",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("TIDEFLOW_BACKEND", "kubernetes")
    monkeypatch.setenv("TIDEFLOW_K8S_NAMESPACE", "ml")
    monkeypatch.setenv("TIDEFLOW_K8S_IMAGE", "registry.example.com/vision/train:7")
    monkeypatch.delenv("TIDEFLOW_K8S_CONN_ID", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def pipeline(tmp_path: Path, entrypoint: str = "[python, -m, vision.train]") -> Path:
    path = tmp_path / "cluster-gang.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        apiVersion: tideflow/v1
        kind: Pipeline
        metadata: {{name: cluster-gang, team: vision}}
        steps:
          - name: train
            gang_training:
              entrypoint: {entrypoint}
              workers: 4
              devices_per_worker: 8
              device: {{class: gpu, model: H100}}
              max_restarts: 2
        """)
    )
    return path


@pytest.mark.usefixtures("airflow_home")
def test_gang_step_becomes_one_volcano_job_and_the_task_follows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster: Cluster
) -> None:
    dag_run = run_dag(pipeline(tmp_path), monkeypatch)
    assert states(dag_run) == {"train": "success"}
    assert len(cluster.posts) == 1 and cluster.posts[0].endswith("/jobs")
    (job,) = cluster.objects.values()
    spec = job["spec"]
    assert spec["minAvailable"] == 4 and spec["queue"] == "vision" and spec["maxRetry"] == 3
    pod = spec["tasks"][0]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example.com/vision/train:7"
    assert container["command"] == ["python", "-m", "vision.train"]  # the image's python
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert pod["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",  # the short name, mapped
        "tideflow.io/pool": "training",  # the broker's training pool
    }
    assert {"key": "tideflow.io/pool", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert (
        env["TIDEFLOW_GANG_ID"].startswith("cluster-gang/")
        and "/checkpoints" in env["TIDEFLOW_CHECKPOINT_URI"]
    )
    (ti,) = dag_run.get_task_instances()
    assert ti.xcom_pull(task_ids="train")["checkpoint_store"] == env["TIDEFLOW_CHECKPOINT_URI"]
    if SCHEMAS.is_dir():  # the Job the operator really submitted, against Volcano's CRD
        schema = crd_schema("volcano/batch.volcano.sh_jobs.yaml", "v1alpha1")
        assert validate({k: v for k, v in job.items() if k != "status"}, schema) == []


@pytest.mark.usefixtures("airflow_home")
def test_kueue_cluster_through_an_airflow_connection_gets_a_jobset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster: Cluster
) -> None:
    kubeconfig = Path(os.environ["KUBECONFIG"])
    monkeypatch.delenv("KUBECONFIG")  # only the connection knows the way
    connection = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}
    monkeypatch.setenv("AIRFLOW_CONN_TIDEFLOW_K8S", json.dumps(connection))
    monkeypatch.setenv("TIDEFLOW_K8S_CONN_ID", "tideflow_k8s")
    monkeypatch.setenv("TIDEFLOW_K8S_GANG_SCHEDULER", "kueue")
    dag_run = run_dag(pipeline(tmp_path), monkeypatch)
    assert states(dag_run) == {"train": "success"}
    (jobset,) = cluster.objects.values()
    assert jobset["kind"] == "JobSet"
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "vision"


@pytest.mark.usefixtures("airflow_home")
def test_module_function_entry_point_is_refused_on_a_cluster_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster: Cluster
) -> None:
    dag_run = run_dag(pipeline(tmp_path, "vision.train:main"), monkeypatch)
    assert states(dag_run) == {"train": "failed"}
    assert cluster.posts == []


def test_bad_kubernetes_settings_name_the_variable_and_what_is_accepted() -> None:
    with pytest.raises(ValueError, match="TIDEFLOW_K8S_GANG_SCHEDULER='slurm': accepted: volcano"):
        kube_settings_from_env({"TIDEFLOW_K8S_GANG_SCHEDULER": "slurm"})
    with pytest.raises(ValueError, match="TIDEFLOW_K8S_GRACE_S='5'"):
        kube_settings_from_env({"TIDEFLOW_K8S_GRACE_S": "5"})
    with pytest.raises(ValueError, match="TIDEFLOW_K8S_DEVICE_MODELS='H100': accepted: MODEL="):
        kube_settings_from_env({"TIDEFLOW_K8S_DEVICE_MODELS": "H100"})
    models = kube_settings_from_env({"TIDEFLOW_K8S_DEVICE_MODELS": "H200=NVIDIA-H200, B200=x"})
    assert models.model_label("H200") == "NVIDIA-H200" and models.model_label("L4") == "L4"
    settings = kube_settings_from_env(
        {"TIDEFLOW_K8S_STORE_SECRET": "", "MLFLOW_TRACKING_URI": "http://mlflow:5000"}
    )
    assert settings.store_secret == "" and settings.mlflow_tracking_uri == "http://mlflow:5000"


def test_service_account_names_come_from_settings_with_the_deployed_defaults() -> None:
    defaults = kube_settings_from_env({})
    # The names deploy/kubernetes creates (gangs.yaml, argo-rbac.yaml).
    assert defaults.gang_service_account == "tideflow-gang"
    assert defaults.argo_service_account == "tideflow-argo-workflow"
    assert defaults.argo_executor_service_account == "tideflow-argo-executor"
    settings = kube_settings_from_env(
        {
            "TIDEFLOW_K8S_GANG_SERVICE_ACCOUNT": "vision-gang",
            "TIDEFLOW_K8S_ARGO_SERVICE_ACCOUNT": "vision-workflow",
            "TIDEFLOW_K8S_ARGO_EXECUTOR_SERVICE_ACCOUNT": "vision-executor",
        }
    )
    assert (
        settings.gang_service_account,
        settings.argo_service_account,
        settings.argo_executor_service_account,
    ) == ("vision-gang", "vision-workflow", "vision-executor")
    with pytest.raises(ValueError, match="TIDEFLOW_K8S_GANG_SERVICE_ACCOUNT='Gang_1': accepted"):
        kube_settings_from_env({"TIDEFLOW_K8S_GANG_SERVICE_ACCOUNT": "Gang_1"})
    with pytest.raises(ValueError, match="TIDEFLOW_K8S_ARGO_EXECUTOR_SERVICE_ACCOUNT=''"):
        kube_settings_from_env({"TIDEFLOW_K8S_ARGO_EXECUTOR_SERVICE_ACCOUNT": ""})


def test_bad_backend_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from tideflow.config import Settings

    monkeypatch.setenv("TIDEFLOW_BACKEND", "k8s")
    with pytest.raises(ValueError, match="TIDEFLOW_BACKEND='k8s': accepted: local, kubernetes"):
        Settings.from_env()


def test_cluster_gang_trigger_serializes_and_resumes_after_a_triggerer_restart(
    cluster: Cluster,
) -> None:
    import time

    from tests.test_kube_jobset import gang
    from tests.trigger_helpers import first_event, round_trip
    from tideflow.operators.cluster import cluster_backend
    from tideflow.operators.triggers import ClusterGangTrigger

    cluster_backend().submit(gang())
    trigger = round_trip(ClusterGangTrigger(gang_id=gang().gang_id, deadline=time.time() + 60))
    event = first_event(trigger)
    assert event["status"] == "finished" and '"state": "succeeded"' in event["gang"]
    assert cluster.gone_once and cluster.watches == 2  # 410 Gone: listed again, watched again
    missing = ClusterGangTrigger(gang_id="never/run/train", deadline=time.time() + 60)
    assert first_event(round_trip(missing)) == {"status": "unknown", "gang_id": "never/run/train"}


def test_cluster_gang_trigger_on_kill_deletes_the_gang_object(cluster: Cluster) -> None:
    """Airflow calls on_kill when a user marks the deferred task failed or clears it."""
    import asyncio
    import time

    from tests.test_kube_jobset import gang
    from tests.trigger_helpers import round_trip
    from tideflow.operators.cluster import cluster_backend
    from tideflow.operators.triggers import ClusterGangTrigger

    cluster_backend().submit(gang())
    assert len(cluster.objects) == 1
    trigger = round_trip(ClusterGangTrigger(gang_id=gang().gang_id, deadline=time.time() + 60))
    asyncio.run(trigger.on_kill())
    assert cluster.objects == {}
