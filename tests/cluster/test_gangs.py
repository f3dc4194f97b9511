"""A gang on real Kueue and JobSet: submitted by the Kubernetes backend as the Airflow
worker's ServiceAccount, admitted by Kueue from the compiled lab queues, its pods
placed by the real scheduler on kwok GPU nodes, followed as the triggerer.

kwok stands in for the kubelet (no container runs here): its stage ends each
worker pod after ``tideflow.io/kwok-run-for`` with the exit code in
``tideflow.io/kwok-exit-code`` (deploy/cluster/kwok-pod-complete.yaml).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.cluster.conftest import NAMESPACE, service_account
from tideflow.backends.kubernetes import KubernetesBackend, follow
from tideflow.backends.protocol import GangJob, GangState, GangStatus, WorkerSlot
from tideflow.compile.kueue_queues import kueue_objects
from tideflow.inventory import ClusterSpec
from tideflow.kube.settings import KubeSettings
from tideflow.spec.loader import load_model
from tideflow.stack.cluster.kubeapi import Kube
from tideflow.stack.cluster.nodes import cluster_nodes
from tideflow.stack.cluster.state import ClusterState

SETTINGS = KubeSettings(gang_scheduler="kueue", termination_grace_s=30)
WORKER = "tideflow-airflow-worker"
TRIGGERER = "tideflow-airflow-triggerer"


def gang(
    name: str,
    team: str,
    workers: int,
    *,
    run_for: str = "3s",
    exit_code: int = 0,
    max_restarts: int = 0,
    model: str = "T4",
) -> GangJob:
    return GangJob(
        f"digits/{name}/train",
        ("python", "-m", "tideflow.examples.digits_train"),
        {},
        tuple(WorkerSlot(rank, "", (0,)) for rank in range(workers)),
        "gpu",
        False,
        max_restarts,
        team=team,
        model=model,
        labels={"tideflow.io/kwok-run-for": run_for, "tideflow.io/kwok-exit-code": str(exit_code)},
    )


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout_s:.0f}s: {what}")


def followed_to_the_end(
    cluster: ClusterState, gang_id: str, timeout_s: float = 120
) -> list[GangStatus | None]:
    """The states the triggerer's watch (``follow``) sees, as its ServiceAccount."""
    from kubernetes_asyncio import config as async_config

    async def watch() -> list[GangStatus | None]:
        api = await async_config.new_client_from_config(config_file=str(cluster.admin))
        api.set_default_header("Impersonate-User", f"system:serviceaccount:{NAMESPACE}:{TRIGGERER}")
        seen: list[GangStatus | None] = []
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                async for status in follow(api, SETTINGS, gang_id, timeout_s=30):
                    seen.append(status)
                    if status is None or status.state.finished:
                        return seen
        finally:
            await api.close()
        raise AssertionError(f"{gang_id} did not finish within {timeout_s}s: {seen}")

    return asyncio.run(watch())


def gang_pods(kube: Kube, gang_id: str) -> list[Any]:
    from tideflow.kube.names import dns_label

    return (
        client.CoreV1Api(kube.api)
        .list_namespaced_pod(NAMESPACE, label_selector=f"tideflow.io/gang={dns_label(gang_id)}")
        .items
    )


def test_a_gang_is_admitted_by_kueue_placed_on_gpu_nodes_and_succeeds(
    lab_queues: None, kube: Kube, cluster: ClusterState
) -> None:
    backend = KubernetesBackend(service_account(cluster, WORKER), SETTINGS)
    job = gang("succeeds", "vision", 2)
    assert backend.submit(job).state in (GangState.PENDING, GangState.RUNNING)
    pods = wait_for(
        "two worker pods bound to nodes",
        lambda: (
            [p for p in gang_pods(kube, job.gang_id) if p.spec.node_name]
            if len(gang_pods(kube, job.gang_id)) == 2
            else None
        ),
    )
    nodes = {p.spec.node_name for p in pods}
    assert len(nodes) == 2 and all(n.startswith("t4-") for n in nodes), nodes
    for pod in pods:
        (container,) = pod.spec.containers
        assert container.resources.limits["nvidia.com/gpu"] == "1"
    seen = followed_to_the_end(cluster, job.gang_id)
    assert seen[-1] is not None and seen[-1].state is GangState.SUCCEEDED, seen
    workloads = kube.dynamic.resources.get(api_version="kueue.x-k8s.io/v1beta2", kind="Workload")
    (workload,) = [
        w
        for w in workloads.get(namespace=NAMESPACE).items
        if w.metadata.ownerReferences[0].name == backend.job_name(job.gang_id)
    ]
    assert workload.status.admission.clusterQueue == "vision"


def test_exit_76_fails_the_gang_at_once_and_exit_75_restarts_it(
    lab_queues: None, kube: Kube, cluster: ClusterState
) -> None:
    backend = KubernetesBackend(service_account(cluster, WORKER), SETTINGS)
    unhealthy = gang("unhealthy", "vision", 1, exit_code=76, max_restarts=3)
    backend.submit(unhealthy)
    seen = followed_to_the_end(cluster, unhealthy.gang_id)
    assert seen[-1] is not None and seen[-1].state is GangState.FAILED
    assert seen[-1].restarts == 0, seen[-1]
    again = gang("tempfail", "vision", 1, exit_code=75, max_restarts=1)
    backend.submit(again)
    seen = followed_to_the_end(cluster, again.gang_id)
    assert seen[-1] is not None and seen[-1].state is GangState.FAILED
    assert seen[-1].restarts == 1, seen[-1]


def test_cancelling_a_gang_deletes_it_and_leaves_no_pod(
    lab_queues: None, kube: Kube, cluster: ClusterState
) -> None:
    backend = KubernetesBackend(service_account(cluster, WORKER), SETTINGS)
    job = gang("timeout", "vision", 2, run_for="10m")
    backend.submit(job)
    wait_for(
        "both workers running",
        lambda: len([p for p in gang_pods(kube, job.gang_id) if p.status.phase == "Running"]) == 2,
    )
    KubernetesBackend(service_account(cluster, TRIGGERER), SETTINGS).cancel(job.gang_id)
    wait_for(
        "the gang and its pods gone",
        lambda: backend.status(job.gang_id) is None and not gang_pods(kube, job.gang_id),
        timeout_s=60,
    )


H100_LAB = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: hopper}
nodes:
  - {name: h100, count: 2, cpu: 64, accelerators: {class: gpu, model: H100, count: 8}}
teams:
  - {name: llm, quota: [{device: gpu, nominal: 16}]}
"""


def test_a_gang_of_a_mapped_model_is_admitted_on_the_nodes_its_flavor_names(
    deployed: Any, kube: Kube, cluster: ClusterState, tmp_path: Path
) -> None:
    """A cluster file that names its GPUs by model only ("H100"): the compiled flavor
    and the gang's pods must both select the product name GPU feature discovery puts
    on the nodes (NVIDIA-H100-80GB-HBM3), or Kueue finds no flavor for the gang."""
    path = tmp_path / "hopper.yaml"
    path.write_text(H100_LAB)
    spec = load_model(path, ClusterSpec)
    kube.create_nodes(cluster_nodes(spec))
    objects, _ = kueue_objects(spec)
    kube.apply(objects, manager="tideflow-compile")
    backend = KubernetesBackend(service_account(cluster, WORKER), SETTINGS)
    job = gang("hopper", "llm", 2, model="H100")
    backend.submit(job)
    seen = followed_to_the_end(cluster, job.gang_id)
    assert seen[-1] is not None and seen[-1].state is GangState.SUCCEEDED, seen
    assert {p.spec.node_name for p in gang_pods(kube, job.gang_id)} <= {"h100-0", "h100-1"}
