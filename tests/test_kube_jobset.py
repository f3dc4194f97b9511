"""The digits gang step as a JobSet admitted by Kueue, and the Kubernetes backend driving it.

No JobSet CRD schema is in ../shared/schemas, so the JobSet's own fields are
checked against the v1alpha2 field names, and the Job it replicates — where
nearly all of the content is — validates strictly as a core ``batch/v1`` Job
with ``kubernetes-validate``. The backend tests run against an HTTP-level fake
of the Kubernetes API (no API server, Kueue or JobSet controller can run
here): the test plays the controller by writing the JobSet's status, and checks
what the backend asks of the API, not what Kubernetes does with it.
"""

from __future__ import annotations

import http.server
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fake_kube import JsonHandler, kube_client
from tests.test_kube_volcano import RUN_ID, rendered_plan
from tideflow.backends import GangJob, GangState, WorkerSlot
from tideflow.backends.kubernetes import KubernetesBackend, gang_kind
from tideflow.kube import KubeSettings, jobset

GOLDEN = Path(__file__).with_name("golden") / "digits-train.jobset.yaml"
KUEUE = KubeSettings(gang_scheduler="kueue")
# spec fields of jobset.x-k8s.io/v1alpha2 JobSet (JobSet v0.10 API reference)
JOBSET_SPEC_FIELDS = {
    "coordinator",
    "failurePolicy",
    "managedBy",
    "network",
    "replicatedJobs",
    "startupPolicy",
    "successPolicy",
    "suspend",
    "ttlSecondsAfterFinished",
    "volumeClaimPolicies",
}


def digits_jobset(repo: Path, **params: Any) -> dict[str, Any]:
    plan = rendered_plan(repo, **params)
    (train,) = [t for t in plan.tasks if t.kind == "gang_training"]
    return jobset(plan, train, run_id=RUN_ID, settings=KUEUE)


def replicated_job(obj: dict[str, Any]) -> dict[str, Any]:
    (replicated,) = obj["spec"]["replicatedJobs"]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"{obj['metadata']['name']}-{replicated['name']}-0"},
        "spec": replicated["template"]["spec"],
    }


def test_gang_is_one_indexed_job_restarted_whole_and_queued_by_team(repo: Path) -> None:
    obj = digits_jobset(repo, workers=2)
    name = obj["metadata"]["name"]
    assert obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "vision"
    spec = obj["spec"]
    assert set(spec) <= JOBSET_SPEC_FIELDS
    assert spec["failurePolicy"]["maxRestarts"] == 2  # the step's max_restarts
    unhealthy, preempted = spec["failurePolicy"]["rules"]
    assert unhealthy["action"] == "FailJobSet"
    assert unhealthy["onJobFailureReasons"] == ["PodFailurePolicy"]
    assert preempted["action"] == "RestartJobSetAndIgnoreMaxRestarts"
    assert spec["network"] == {"enableDNSHostnames": True, "subdomain": name}
    job = replicated_job(obj)["spec"]
    assert job["completionMode"] == "Indexed"
    assert job["parallelism"] == job["completions"] == 2
    assert job["backoffLimit"] == 0  # one failed pod fails the Job, so JobSet restarts all
    exit_76, disrupted = job["podFailurePolicy"]["rules"]
    assert exit_76["action"] == "FailJob" and exit_76["onExitCodes"]["values"] == [76]
    assert disrupted["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]
    pod = job["template"]["spec"]
    assert pod["priorityClassName"] == "tideflow-training"
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["MASTER_ADDR"] == f"{name}-worker-0-0.{name}" and env["WORLD_SIZE"] == "2"
    assert container["envFrom"] == [{"secretRef": {"name": "tideflow-store"}}]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert job["template"]["metadata"]["labels"]["tideflow.io/gang"]
    assert replicated_job(digits_jobset(repo, workers=1))["spec"]["parallelism"] == 1


def test_gang_pods_run_as_the_gang_service_account_without_a_token_as_mlflow_clients(
    repo: Path,
) -> None:
    from tideflow.kube.pods import MLFLOW_CLIENT_LABEL

    obj = digits_jobset(repo)
    template = replicated_job(obj)["spec"]["template"]
    assert template["spec"]["serviceAccountName"] == KUEUE.gang_service_account
    assert template["spec"]["automountServiceAccountToken"] is False
    assert template["metadata"]["labels"][MLFLOW_CLIENT_LABEL] == "true"
    assert MLFLOW_CLIENT_LABEL not in obj["metadata"]["labels"]


def test_replicated_job_validates_strictly_as_a_core_job(repo: Path) -> None:
    import kubernetes_validate

    job = replicated_job(digits_jobset(repo))
    kubernetes_validate.validate(job, "1.33", strict=True)
    job["spec"]["podFailurePolicy"]["rules"][0]["onExitCode"] = job["spec"]["podFailurePolicy"][
        "rules"
    ][0].pop("onExitCodes")
    with pytest.raises(kubernetes_validate.ValidationError, match="onExitCode"):
        kubernetes_validate.validate(job, "1.33", strict=True)


def test_jobset_matches_its_golden_file(repo: Path) -> None:
    text = yaml.safe_dump(digits_jobset(repo), sort_keys=True)
    if os.environ.get("TIDEFLOW_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "regenerate with TIDEFLOW_UPDATE_GOLDEN=1 and review"


def test_an_unknown_gang_scheduler_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'slurm' is not supported; accepted: volcano, kueue"):
        gang_kind("slurm")


# -- the backend, with gang_scheduler = kueue -------------------------------------------

JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets"


class FakeApi:
    def __init__(self) -> None:
        self.jobsets: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []


def handler_for(api: FakeApi) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def _path(self) -> str:
            path = self.path.split("?", 1)[0]
            api.requests.append((self.command, path))
            return path

        def do_POST(self) -> None:  # noqa: N802 - http.server names
            path, body = self._path(), self._body()
            if path != JOBSETS:
                return self._send(404, {"kind": "Status", "code": 404})
            name = body["metadata"]["name"]
            if name in api.jobsets:
                return self._send(409, {"kind": "Status", "code": 409})
            # Kueue's webhook suspends a new workload until it is admitted.
            status = {"conditions": [{"type": "Suspended", "status": "True"}]}
            api.jobsets[name] = body | {"status": status}
            return self._send(201, api.jobsets[name])

        def do_GET(self) -> None:  # noqa: N802 - http.server names
            if match := re.fullmatch(JOBSETS + r"/([\w-]+)", self._path()):
                found = api.jobsets.get(match.group(1))
                return self._send(200, found) if found else self._send(404, {"code": 404})
            return self._send(404, {"code": 404})

        def do_DELETE(self) -> None:  # noqa: N802 - http.server names
            if match := re.fullmatch(JOBSETS + r"/([\w-]+)", self._path()):
                if api.jobsets.pop(match.group(1), None) is None:
                    return self._send(404, {"code": 404})
                return self._send(200, {"kind": "Status", "status": "Success"})
            return self._send(404, {"code": 404})

    return Handler


@pytest.fixture
def fake() -> Iterator[tuple[FakeApi, Any]]:
    api = FakeApi()
    with kube_client(handler_for(api)) as client:
        yield api, client


def gang() -> GangJob:
    return GangJob(
        "digits/manual__2026-11-23T12:00:00+00:00/train",
        ("python", "-m", "tideflow.examples.digits_train"),
        {"TIDEFLOW_CHECKPOINT_URI": "s3://tideflow/ckpt"},
        tuple(WorkerSlot(rank, "", (0, 1)) for rank in range(4)),
        "gpu",
        False,
        3,
        team="nlp",
        model="H100",
    )


def test_kueue_backend_creates_one_jobset_and_follows_admission_and_restarts(
    fake: tuple[FakeApi, Any],
) -> None:
    api, client = fake
    backend = KubernetesBackend(client, KubeSettings(namespace="ml", gang_scheduler="kueue"))
    pending = backend.submit(gang())
    assert pending.state is GangState.PENDING and "Kueue" in pending.message
    (name,) = api.jobsets
    obj = api.jobsets[name]
    assert obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "nlp"
    pod = obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert pod["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",  # the short name, mapped
        "tideflow.io/pool": "training",  # the broker's training pool
    }
    assert {"key": "tideflow.io/pool", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]

    def state(status: dict[str, Any]) -> Any:
        api.jobsets[name]["status"] = status
        found = backend.status(gang().gang_id)
        assert found is not None
        return found

    admitted = {"replicatedJobsStatus": [{"name": "worker", "active": 1, "ready": 1}]}
    assert state(admitted).state is GangState.RUNNING
    after_eviction = state({**admitted, "restarts": 1})
    assert after_eviction.state is GangState.RUNNING and after_eviction.restarts == 1
    # a worker restarted after that reattaches to the same JobSet
    assert KubernetesBackend(client, backend.settings).submit(gang()).restarts == 1
    assert [r for r in api.requests if r[0] == "POST"] == [("POST", JOBSETS)]
    done = state({"restarts": 1, "conditions": [{"type": "Completed", "status": "True"}]})
    assert done.state is GangState.SUCCEEDED
    failed = state(
        {
            "restarts": 0,
            "conditions": [
                {"type": "Completed", "status": "False"},
                {"type": "Failed", "status": "True", "message": "FailJobSet: PodFailurePolicy"},
            ],
        }
    )
    assert failed.state is GangState.FAILED and "PodFailurePolicy" in failed.message
    backend.cancel(gang().gang_id)
    assert backend.status(gang().gang_id) is None
