"""The Kubernetes gang backend against an HTTP-level fake of the Kubernetes API.

No API server (and no Volcano controller) can run here: a small HTTP server on
127.0.0.1 keeps Volcano Jobs and pods in memory and records requests; the test
plays the controller by setting a Job's ``status.state.phase``. It checks what
the backend asks of the API (create once, read status, evict, delete), not what
Kubernetes does with it.
"""

from __future__ import annotations

import http.server
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fake_kube import JsonHandler, kube_client
from tideflow.backends import GangJob, GangState, WorkerSlot
from tideflow.backends.kubernetes import KubernetesBackend
from tideflow.kube import KubeSettings

JOBS = "/apis/batch.volcano.sh/v1alpha1/namespaces/ml/jobs"


class FakeApi:
    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, str] = {}  # pod name -> gang label
        self.requests: list[tuple[str, str]] = []


def handler_for(api: FakeApi) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def _path(self) -> str:
            path = self.path.split("?", 1)[0]
            api.requests.append((self.command, path))
            return path

        def do_POST(self) -> None:  # noqa: N802 - http.server names
            path, body = self._path(), self._body()
            if path == JOBS:
                name = body["metadata"]["name"]
                if name in api.jobs:
                    return self._send(409, {"kind": "Status", "code": 409})
                api.jobs[name] = body | {"status": {"state": {"phase": "Pending"}}}
                gang = body["metadata"]["labels"]["tideflow.io/gang"]
                for rank in range(body["spec"]["minAvailable"]):
                    api.pods[f"{name}-worker-{rank}"] = gang
                return self._send(201, api.jobs[name])
            if match := re.fullmatch(r"/api/v1/namespaces/ml/pods/([\w-]+)/eviction", path):
                api.pods.pop(match.group(1))
                return self._send(201, {"kind": "Status", "status": "Success"})
            return self._send(404, {"kind": "Status", "code": 404})

        def do_GET(self) -> None:  # noqa: N802 - http.server names
            path = self._path()
            if match := re.fullmatch(JOBS + r"/([\w-]+)", path):
                job = api.jobs.get(match.group(1))
                return self._send(200, job) if job else self._send(404, {"code": 404})
            if path == "/api/v1/namespaces/ml/pods":
                gang = self.path.split("tideflow.io%2Fgang%3D", 1)[1]
                items = [
                    {"metadata": {"name": n, "namespace": "ml"}}
                    for n, g in api.pods.items()
                    if g == gang
                ]
                return self._send(200, {"kind": "PodList", "items": items})
            return self._send(404, {"code": 404})

        def do_DELETE(self) -> None:  # noqa: N802 - http.server names
            path = self._path()
            if match := re.fullmatch(JOBS + r"/([\w-]+)", path):
                if api.jobs.pop(match.group(1), None) is None:
                    return self._send(404, {"code": 404})
                return self._send(200, {"kind": "Status", "status": "Success"})
            return self._send(404, {"code": 404})

    return Handler


@pytest.fixture
def fake() -> Iterator[tuple[FakeApi, Any]]:
    api = FakeApi()
    with kube_client(handler_for(api)) as client:
        yield api, client


def gang(gang_id: str = "digits/manual__2026-11-23T12:00:00+00:00/train") -> GangJob:
    return GangJob(
        gang_id,
        ("python", "-m", "tideflow.examples.digits_train", "--epochs", "10"),
        {"TIDEFLOW_CHECKPOINT_URI": "s3://tideflow/ckpt"},
        tuple(WorkerSlot(rank, "", (0,)) for rank in range(4)),
        "gpu",
        False,
        2,
        team="vision",
        model="H100",
    )


def test_submit_creates_one_volcano_job_and_follows_its_state(
    fake: tuple[FakeApi, Any],
) -> None:
    api, client = fake
    backend = KubernetesBackend(client, KubeSettings(namespace="ml"))
    status = backend.submit(gang())
    assert status.state is GangState.PENDING
    (name,) = api.jobs
    job = api.jobs[name]
    assert job["spec"]["minAvailable"] == 4 and job["spec"]["queue"] == "vision"
    assert job["spec"]["maxRetry"] == 3  # 2 restarts, as Volcano counts
    pod = job["spec"]["tasks"][0]["template"]["spec"]
    assert pod["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",  # the short name, mapped
        "tideflow.io/pool": "training",  # the broker's training pool
    }
    assert {"key": "tideflow.io/pool", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}

    api.jobs[name]["status"] = {"state": {"phase": "Running"}}
    assert backend.status(gang().gang_id).state is GangState.RUNNING  # type: ignore[union-attr]
    api.jobs[name]["status"] = {"state": {"phase": "Restarting"}, "retryCount": 1}
    restarting = backend.status(gang().gang_id)
    assert restarting is not None and restarting.restarts == 1
    api.jobs[name]["status"] = {"state": {"phase": "Completed"}, "retryCount": 1}
    assert backend.status(gang().gang_id).state is GangState.SUCCEEDED  # type: ignore[union-attr]
    assert backend.status("never/seen") is None


def test_a_restarted_worker_reattaches_instead_of_creating_a_second_job(
    fake: tuple[FakeApi, Any],
) -> None:
    api, client = fake
    KubernetesBackend(client, KubeSettings(namespace="ml")).submit(gang())
    api.jobs[next(iter(api.jobs))]["status"] = {"state": {"phase": "Running"}}
    fresh = KubernetesBackend(client, KubeSettings(namespace="ml"))  # after a worker restart
    assert fresh.reattach(gang().gang_id).state is GangState.RUNNING  # type: ignore[union-attr]
    assert fresh.submit(gang()).state is GangState.RUNNING
    assert [r for r in api.requests if r[0] == "POST"] == [("POST", JOBS)]  # created once


def test_preempt_evicts_the_gangs_pods_and_cancel_deletes_the_job(
    fake: tuple[FakeApi, Any],
) -> None:
    api, client = fake
    backend = KubernetesBackend(client, KubeSettings(namespace="ml"))
    backend.submit(gang())
    backend.submit(gang("other/run/train"))
    backend.preempt(gang().gang_id)
    assert len(api.pods) == 4  # only the other gang's pods remain
    evictions = [r for r in api.requests if r[1].endswith("/eviction")]
    assert len(evictions) == 4
    backend.cancel(gang().gang_id)
    backend.cancel(gang().gang_id)  # a second cancel is harmless
    assert backend.status(gang().gang_id) is None and len(api.jobs) == 1
