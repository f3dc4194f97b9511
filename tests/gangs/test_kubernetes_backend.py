"""The Kubernetes gang backend (Volcano) against the one Kubernetes fake (tests/kubefake).

No API server or Volcano controller can run here: the fake plays them over HTTP
for the official ``kubernetes`` client, admits the Job through Volcano's
webhooks and the CRD schema, authorizes every call by deploy/'s RBAC, and moves
the Job's state as Volcano's controller does when the test starts, fails or
completes its pods. Each call is made as the identity that makes it in a
deployment: the Airflow worker submits and reads, the triggerer deletes, the
broker (the only role allowed to evict) preempts.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kubefake import DEPLOY, KubeFake, service_account
from tideflow.backends import GangJob, GangState, WorkerSlot
from tideflow.backends.kubernetes import KubernetesBackend
from tideflow.kube import KubeSettings

NS = "tideflow"
WORKER = service_account(NS, "tideflow-airflow-worker")
TRIGGERER = service_account(NS, "tideflow-airflow-triggerer")
BROKER = service_account(NS, "tideflow-broker")
SETTINGS = KubeSettings(namespace=NS)


@pytest.fixture
def fake() -> Iterator[KubeFake]:
    with KubeFake() as cluster:
        cluster.apply(DEPLOY / "priority-classes.yaml")
        # The team queues are state this test is not about (see test_kube_conformance.py).
        cluster.seed(DEPLOY / "volcano-queues.yaml")
        yield cluster


def backend(fake: KubeFake, user: str = WORKER) -> KubernetesBackend:
    return KubernetesBackend(fake.client(user), SETTINGS)


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


def test_submit_creates_one_volcano_job_and_follows_its_state(fake: KubeFake) -> None:
    worker = backend(fake)
    status = worker.submit(gang())
    assert status.state is GangState.PENDING
    name = worker.job_name(gang().gang_id)
    job = fake.volcano.job(NS, name)  # as admitted: Volcano's webhooks passed it
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

    fake.volcano.pods_running(NS, name)
    assert worker.status(gang().gang_id).state is GangState.RUNNING  # type: ignore[union-attr]
    fake.volcano.pod_failed(NS, name, index=2, exit_code=1)  # a crash restarts the gang
    restarting = worker.status(gang().gang_id)
    assert restarting is not None and restarting.state is GangState.RUNNING  # Restarting
    assert restarting.restarts == 1
    fake.pods.finish_terminating(NS)
    fake.volcano.pods_running(NS, name)
    fake.volcano.pods_succeeded(NS, name)
    done = worker.status(gang().gang_id)
    assert done is not None and done.state is GangState.SUCCEEDED and done.restarts == 1
    assert worker.status("never/seen") is None
    verbs = {(r.verb, r.resource, r.code) for r in fake.requests_by(WORKER)}
    assert verbs == {("get", "jobs", 404), ("create", "jobs", 201), ("get", "jobs", 200)}


def test_a_restarted_worker_reattaches_instead_of_creating_a_second_job(fake: KubeFake) -> None:
    backend(fake).submit(gang())
    fake.volcano.pods_running(NS, backend(fake).job_name(gang().gang_id))
    fresh = backend(fake)  # after a worker restart
    assert fresh.reattach(gang().gang_id).state is GangState.RUNNING  # type: ignore[union-attr]
    assert fresh.submit(gang()).state is GangState.RUNNING
    creates = [r for r in fake.requests_by(WORKER) if r.method == "POST"]
    assert [(r.resource, r.code) for r in creates] == [("jobs", 201)]  # created once


def test_preempt_evicts_the_gangs_pods_and_cancel_deletes_the_job(fake: KubeFake) -> None:
    from kubernetes.client.rest import ApiException

    worker = backend(fake)
    worker.submit(gang())
    worker.submit(gang("other/run/train"))
    name, other = worker.job_name(gang().gang_id), worker.job_name("other/run/train")
    for job in (name, other):
        fake.volcano.pods_running(NS, job)
    untouched = {p["metadata"]["uid"] for p in fake.volcano.pods(fake.volcano.job(NS, other))}
    # deploy/kubernetes/airflow-rbac.yaml: Airflow's identities may not evict; the broker may
    with pytest.raises(ApiException) as refused:
        worker.preempt(gang().gang_id)
    assert refused.value.status == 403
    backend(fake, BROKER).preempt(gang().gang_id)
    evictions = [r for r in fake.requests_by(BROKER) if r.resource == "pods/eviction"]
    assert [r.code for r in evictions] == [201] * 4
    # the gang's workers stop; Volcano aborts the gang when they are gone (preempted)
    assert {p["metadata"]["uid"] for p in fake.volcano.pods(fake.volcano.job(NS, other))} == (
        untouched
    )
    fake.pods.finish_terminating(NS)
    assert fake.volcano.phase(NS, name) == "Aborted" and fake.volcano.phase(NS, other) == "Running"
    preempted = worker.status(gang().gang_id)
    assert preempted is not None and preempted.state is GangState.PREEMPTED
    triggerer = backend(fake, TRIGGERER)
    triggerer.cancel(gang().gang_id)
    triggerer.cancel(gang().gang_id)  # a second cancel is harmless
    assert worker.status(gang().gang_id) is None
    assert [j["metadata"]["name"] for j in fake.list("batch.volcano.sh/v1alpha1", "Job", NS)] == [
        other
    ]
    deletes = fake.requests_by(TRIGGERER)
    assert [(r.verb, r.code) for r in deletes] == [("delete", 200), ("delete", 404)]
    assert all("propagationPolicy=Foreground" in r.path for r in deletes)  # pods go with it


def test_a_retry_after_a_failed_gang_replaces_it_and_a_succeeded_one_is_kept(
    fake: KubeFake,
) -> None:
    """An Airflow (or Argo) retry of a failed gang step is a new attempt: the failed Job is
    replaced under the same name with all its restarts, never left beside a second one.
    A succeeded gang is kept: its result stands."""
    worker = backend(fake)
    job = GangJob(**{**gang().__dict__, "max_restarts": 0})
    worker.submit(job)
    name = worker.job_name(job.gang_id)
    fake.volcano.pods_running(NS, name)
    fake.volcano.pod_failed(NS, name, exit_code=1)
    fake.pods.finish_terminating(NS)
    failed = worker.status(job.gang_id)
    assert failed is not None and failed.state is GangState.FAILED
    first_uid = fake.volcano.job(NS, name)["metadata"]["uid"]
    retried = worker.submit(job)
    assert retried.state is GangState.PENDING and retried.restarts == 0
    replacement = fake.volcano.job(NS, name)
    assert replacement["metadata"]["uid"] != first_uid
    assert [j["metadata"]["name"] for j in fake.list("batch.volcano.sh/v1alpha1", "Job", NS)] == [
        name
    ]
    fake.volcano.pods_running(NS, name)
    fake.volcano.pods_succeeded(NS, name)
    assert worker.submit(job).state is GangState.SUCCEEDED
    assert fake.volcano.job(NS, name)["metadata"]["uid"] == replacement["metadata"]["uid"]
