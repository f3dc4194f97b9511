"""The same JobSet tests against both Kubernetes backends: the fake (tests/kubefake) and
the real control plane (one client fixture, two backends). Where they disagree, one
of them is wrong: the real API server, Kueue's and JobSet's webhooks and CRDs are
the reference, and the fake is fixed.

On the real control plane kwok stands in for the kubelet and the containers;
nothing else is faked.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.conftest import NAMESPACE, service_account
from tests.kube.test_kube_jobset import digits_jobset, gang
from tests.kubefake import DEPLOY, KubeFake
from tests.kubefake import service_account as fake_service_account
from tideflow.backends import GangState, WorkerSlot
from tideflow.backends.kubernetes import KubernetesBackend
from tideflow.kube import KubeSettings

SETTINGS = KubeSettings(namespace=NAMESPACE, gang_scheduler="kueue")
WORKER = "tideflow-airflow-worker"
TRIGGERER = "tideflow-airflow-triggerer"
JOBSETS = ("jobset.x-k8s.io", "v1alpha2", NAMESPACE, "jobsets")

Identity = Callable[[str], Any]  # a ServiceAccount's name -> an API client acting as it


@pytest.fixture(params=["kubefake", "cluster"])
def as_account(request: pytest.FixtureRequest) -> Iterator[Identity]:
    """A client acting as a ServiceAccount of the tideflow namespace, on either backend,
    with deploy/kubernetes's priority classes, Kueue queues and RBAC in place."""
    if request.param == "kubefake":
        with KubeFake() as fake:
            fake.apply(DEPLOY / "priority-classes.yaml", DEPLOY / "kueue-queues.yaml")
            yield lambda name: fake.client(fake_service_account(NAMESPACE, name))
        return
    request.getfixturevalue("deployed")
    cluster = request.getfixturevalue("cluster")
    yield lambda name: service_account(cluster, name)


def test_the_digits_jobset_is_admitted_by_the_jobset_and_kueue_webhooks(
    repo: Path, as_account: Identity
) -> None:
    custom = client.CustomObjectsApi(as_account(WORKER))
    body = digits_jobset(repo)
    body["metadata"]["name"] = "digits-both-webhooks"
    created = custom.create_namespaced_custom_object(*JOBSETS, body)
    try:
        assert created["spec"]["suspend"] is True  # Kueue's webhook: wait for admission
        assert created["spec"]["replicatedJobs"][0]["groupName"] == "default"  # CRD default
    finally:
        custom.delete_namespaced_custom_object(
            *JOBSETS, "digits-both-webhooks", propagation_policy="Foreground"
        )


def test_the_backend_submits_once_reattaches_and_cancels_as_the_airflow_identities(
    as_account: Identity,
) -> None:
    backend = KubernetesBackend(as_account(WORKER), SETTINGS)
    job = gang("digits/manual__2026-11-29T00:00:00+00:00/both")
    first = backend.submit(job)
    assert first.state in (GangState.PENDING, GangState.RUNNING)
    custom = client.CustomObjectsApi(as_account(WORKER))
    name = backend.job_name(job.gang_id)
    stored = custom.get_namespaced_custom_object(*JOBSETS, name)
    assert stored["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "nlp"
    backend.submit(job)  # a retried task reattaches: the same JobSet, no second one
    again = custom.get_namespaced_custom_object(*JOBSETS, name)
    assert again["metadata"]["uid"] == stored["metadata"]["uid"]
    KubernetesBackend(as_account(TRIGGERER), SETTINGS).cancel(job.gang_id)
    KubernetesBackend(as_account(TRIGGERER), SETTINGS).cancel(job.gang_id)  # gone: no error


def test_a_gang_beyond_every_quota_stays_suspended_and_is_reported_pending(
    as_account: Identity,
) -> None:
    """64 workers of 8 H100s: more than the training cohort's whole quota, so Kueue
    admits it nowhere and the JobSet stays suspended, which the backend reports."""
    backend = KubernetesBackend(as_account(WORKER), SETTINGS)
    job = dataclasses.replace(
        gang("digits/manual__2026-11-29T00:00:00+00:00/huge"),
        slots=tuple(WorkerSlot(rank, "", tuple(range(8))) for rank in range(64)),
    )
    try:
        backend.submit(job)
        time.sleep(3)  # time enough for Kueue to try to admit it
        status = backend.status(job.gang_id)
        assert status is not None and status.state is GangState.PENDING
        assert status.message == "jobset is suspended"
    finally:
        KubernetesBackend(as_account(TRIGGERER), SETTINGS).cancel(job.gang_id)
