"""The digits gang step as a JobSet admitted by Kueue, and the Kubernetes backend driving it.

The JobSet's fields are checked against the v1alpha2 field names, and the Job it
replicates — where nearly all of the content is — validates strictly as a core
``batch/v1`` Job with ``kubernetes-validate``. The backend tests run against the
one Kubernetes fake (tests/kubefake): no API server, Kueue or JobSet controller
can run here, so the fake admits the JobSet through the CRD schema, the JobSet
and Kueue webhooks, authorizes each call by deploy/'s RBAC, and moves the
JobSet as Kueue and the JobSet and Job controllers do when the test admits it,
starts, evicts, fails or completes its pods.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kube.test_kube_volcano import digits_gang_object
from tests.kubefake import DEPLOY, KubeFake, service_account
from tideflow.backends import GangJob, GangState, WorkerSlot
from tideflow.backends.kubernetes import KubernetesBackend, gang_kind
from tideflow.kube import KubeSettings

GOLDEN = Path(__file__).parents[1] / "golden" / "digits-train.jobset.yaml"
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
    return digits_gang_object(repo, KUEUE, **params)


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
    env = {e["name"]: e.get("value") for e in container["env"]}
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

NS = "tideflow"
WORKER = service_account(NS, "tideflow-airflow-worker")
TRIGGERER = service_account(NS, "tideflow-airflow-triggerer")
BROKER = service_account(NS, "tideflow-broker")
SETTINGS = KubeSettings(namespace=NS, gang_scheduler="kueue")


@pytest.fixture
def fake() -> Iterator[KubeFake]:
    with KubeFake() as cluster:
        cluster.apply(DEPLOY / "priority-classes.yaml", DEPLOY / "kueue-queues.yaml")
        yield cluster


def gang(gang_id: str = "digits/manual__2026-11-23T12:00:00+00:00/train") -> GangJob:
    return GangJob(
        gang_id,
        ("python", "-m", "tideflow.examples.digits_train"),
        {"TIDEFLOW_CHECKPOINT_URI": "s3://tideflow/ckpt"},
        tuple(WorkerSlot(rank, "", (0, 1)) for rank in range(4)),
        "gpu",
        False,
        3,
        team="nlp",
        model="H100",
    )


def test_the_digits_jobset_is_admitted_by_the_jobset_and_kueue_webhooks(
    repo: Path, fake: KubeFake
) -> None:
    created = fake.create(digits_jobset(repo), WORKER)
    assert created["spec"]["suspend"] is True  # Kueue's webhook: wait for admission
    assert created["spec"]["replicatedJobs"][0]["groupName"] == "default"  # CRD default


def test_kueue_backend_creates_one_jobset_and_follows_admission_and_restarts(
    fake: KubeFake,
) -> None:
    backend = KubernetesBackend(fake.client(WORKER), SETTINGS)
    pending = backend.submit(gang())
    assert pending.state is GangState.PENDING
    name = backend.job_name(gang().gang_id)
    obj = fake.jobset.jobset(NS, name)
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
    suspended = backend.status(gang().gang_id)
    assert suspended is not None and suspended.state is GangState.PENDING
    assert suspended.message == "jobset is suspended"  # the JobSet controller's condition

    # Kueue admits it on the H100s the nlp ClusterQueue borrows from the training cohort
    assert fake.kueue.admit(NS, name) == {"nvidia.com/gpu": "h100"}
    fake.jobset.pods_running(NS, name)
    assert backend.status(gang().gang_id).state is GangState.RUNNING  # type: ignore[union-attr]
    # the broker evicts the gang: it restarts without using up a restart
    KubernetesBackend(fake.client(BROKER), SETTINGS).preempt(gang().gang_id)
    fake.pods.finish_terminating(NS)
    after_eviction = backend.status(gang().gang_id)
    assert after_eviction is not None and after_eviction.state is GangState.RUNNING
    assert after_eviction.restarts == 1
    # a worker restarted after that reattaches to the same JobSet
    assert KubernetesBackend(fake.client(WORKER), SETTINGS).submit(gang()).restarts == 1
    creates = [r for r in fake.requests_by(WORKER) if r.method == "POST"]
    assert [(r.resource, r.code) for r in creates] == [("jobsets", 201)]
    fake.jobset.pods_running(NS, name)
    fake.jobset.pods_succeeded(NS, name)
    done = backend.status(gang().gang_id)
    assert done is not None and done.state is GangState.SUCCEEDED and done.restarts == 1

    # exit 76, the training-health guard: the JobSet fails at once
    other = gang("digits/manual__2026-11-24T12:00:00+00:00/train")
    backend.submit(other)
    fake.kueue.admit(NS, backend.job_name(other.gang_id))
    fake.jobset.pods_running(NS, backend.job_name(other.gang_id))
    fake.jobset.pod_failed(NS, backend.job_name(other.gang_id), exit_code=76)
    failed = backend.status(other.gang_id)
    assert failed is not None and failed.state is GangState.FAILED and failed.restarts == 0
    assert "FailJobSet" in failed.message
    KubernetesBackend(fake.client(TRIGGERER), SETTINGS).cancel(gang().gang_id)
    assert backend.status(gang().gang_id) is None
