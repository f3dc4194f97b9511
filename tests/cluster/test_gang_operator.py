"""The digits gang submitted by the Airflow operator (``GangTrainingOperator`` with
``TIDEFLOW_BACKEND=kubernetes``) on the real control plane, run by Airflow's own
``dag.test()``: the task creates a JobSet as the Airflow worker's ServiceAccount,
Kueue admits it from the compiled lab queues, the real scheduler binds its pods to
kwok GPU nodes, and the task's trigger follows it (``kubernetes_asyncio`` watch) as
the triggerer's ServiceAccount until the operator resumes with the gang's end.
Both identities are real ones: tokens of their ServiceAccounts (TokenRequest API).

kwok stands in for the kubelet and the containers, nothing else is faked: its stage
ends each worker pod after the time its step's ``KWOK_RUN_FOR`` says (default 1s,
deploy/cluster/kwok-pod-complete.yaml), and the checkpoint rank 0 would commit is
written by the test into the store the JobSet's pods are given.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.conftest import NAMESPACE, service_account_kubeconfig
from tests.cluster.test_gangs import TRIGGERER, WORKER, gang_pods, wait_for
from tests.gangs.test_gang_operator import run_dag, states
from tests.simulated_workers import commit_as_workers
from tideflow.stack.cluster.kubeapi import Kube
from tideflow.stack.cluster.state import ClusterState

DIGITS = Path(__file__).parents[2] / "pipelines" / "digits.yaml"
JOBSET = ("jobset.x-k8s.io/v1alpha2", "JobSet")


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def on_cluster(
    lab_queues: None, cluster: ClusterState, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gang steps go to the test cluster: the task as the worker, its trigger as the
    triggerer (``dag.test()`` runs both in this process, so the trigger's client is made
    from the triggerer's kubeconfig, as the triggerer pod's would be)."""
    from tideflow.operators import cluster as cluster_module

    worker = service_account_kubeconfig(cluster, WORKER, tmp_path / "worker.kubeconfig")
    triggerer = service_account_kubeconfig(cluster, TRIGGERER, tmp_path / "triggerer.kubeconfig")
    original = cluster_module.async_api_client

    @contextlib.asynccontextmanager
    async def as_triggerer() -> AsyncIterator[Any]:
        async with contextlib.AsyncExitStack() as stack:
            with environment({"KUBECONFIG": str(triggerer)}):
                api = await stack.enter_async_context(original())
            yield api

    monkeypatch.setattr(cluster_module, "async_api_client", as_triggerer)
    monkeypatch.setenv("KUBECONFIG", str(worker))
    monkeypatch.setenv("TIDEFLOW_BACKEND", "kubernetes")
    monkeypatch.setenv("TIDEFLOW_K8S_GANG_SCHEDULER", "kueue")
    monkeypatch.setenv("TIDEFLOW_K8S_NAMESPACE", NAMESPACE)
    monkeypatch.delenv("TIDEFLOW_K8S_CONN_ID", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)


def digits_gang(tmp_path: Path, *, timeout: str = "null", run_for: str = "5s") -> Path:
    """pipelines/digits.yaml's gang step alone, on the lab's T4 GPUs (the example runs
    on CPUs, which the kwok nodes do not offer), its data as fixed paths (no data step
    runs before it), its workers running ``run_for`` under kwok."""
    pipeline = yaml.safe_load(DIGITS.read_text())
    (train,) = [step for step in pipeline["steps"] if step["name"] == "train"]
    del train["needs"]
    train["timeout"] = None if timeout == "null" else timeout
    train["retries"] = 0
    gang = train["gang_training"]
    gang["entrypoint"] = [
        part.replace(
            "{{ ti.xcom_pull(task_ids='prepare-data')['train'] }}", "/data/train.npz"
        ).replace("{{ ti.xcom_pull(task_ids='prepare-data')['validation'] }}", "/data/val.npz")
        for part in gang["entrypoint"]
    ]
    gang["device"] = {"class": "gpu", "model": "T4"}
    gang["env"] = {"KWOK_RUN_FOR": run_for}
    pipeline["steps"] = [train]
    path = tmp_path / "digits.yaml"
    path.write_text(yaml.safe_dump(pipeline, sort_keys=False))
    return path


def jobsets(kube: Kube) -> list[dict[str, Any]]:
    resource = kube.dynamic.resources.get(api_version=JOBSET[0], kind=JOBSET[1])
    found = resource.get(namespace=NAMESPACE, label_selector="tideflow.io/pipeline=digits")
    return [item.to_dict() for item in found.items]


def commit_when_submitted(kube: Kube) -> threading.Thread:
    """As rank 0 would: a checkpoint in the store of the JobSet's pods, once it exists."""

    def commit() -> None:
        (jobset,) = wait_for("the digits JobSet", lambda: jobsets(kube), timeout_s=300)
        commit_as_workers(jobset)

    thread = threading.Thread(target=commit, daemon=True)
    thread.start()
    return thread


@pytest.mark.usefixtures("airflow_home", "on_cluster")
def test_the_digits_gang_step_runs_as_a_jobset_admitted_by_kueue_and_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kube: Kube
) -> None:
    committer = commit_when_submitted(kube)
    dag_run = run_dag(digits_gang(tmp_path), monkeypatch)
    committer.join(timeout=5)
    assert states(dag_run) == {"train": "success"}
    (jobset,) = jobsets(kube)
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "vision"
    assert jobset["status"]["terminalState"] == "Completed"
    gang = jobset["metadata"]["labels"]["tideflow.io/gang"]
    pods = gang_pods(kube, gang)
    assert len(pods) == 2 and all(p.status.phase == "Succeeded" for p in pods), pods
    assert all(p.spec.node_name.startswith("t4-") for p in pods)
    workloads = kube.dynamic.resources.get(api_version="kueue.x-k8s.io/v1beta2", kind="Workload")
    (workload,) = [
        w
        for w in workloads.get(namespace=NAMESPACE).items
        if w.metadata.ownerReferences[0].name == jobset["metadata"]["name"]
    ]
    assert workload.status.admission.clusterQueue == "vision"
    (ti,) = dag_run.get_task_instances()
    assert ti.xcom_pull(task_ids="train")["restarts"] == 0
    resource = kube.dynamic.resources.get(api_version=JOBSET[0], kind=JOBSET[1])
    resource.delete(name=jobset["metadata"]["name"], namespace=NAMESPACE)


@pytest.mark.usefixtures("airflow_home", "on_cluster")
def test_the_digits_step_past_its_timeout_deletes_its_jobset_and_leaves_no_pod(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kube: Kube,
    capfd: pytest.CaptureFixture[str],
) -> None:
    running: list[str] = []

    def note_running() -> None:
        (jobset,) = wait_for("the digits JobSet", lambda: jobsets(kube), timeout_s=300)
        gang = jobset["metadata"]["labels"]["tideflow.io/gang"]
        wait_for(
            "both workers running",
            lambda: [p for p in gang_pods(kube, gang) if p.status.phase == "Running"][1:],
        )
        running.append(gang)

    watcher = threading.Thread(target=note_running, daemon=True)
    watcher.start()
    dag_run = run_dag(digits_gang(tmp_path, timeout="40s", run_for="10m"), monkeypatch)
    watcher.join(timeout=5)  # it noted the workers running, or gave up
    assert states(dag_run) == {"train": "failed"}
    assert running, "the workers never ran before the timeout"
    assert "ran past its timeout (0:00:40): gang digits/" in capfd.readouterr().out
    # deleted in the foreground: the JobSet goes once its Jobs and their pods have gone
    wait_for(
        "the JobSet and its pods gone",
        lambda: not jobsets(kube) and not gang_pods(kube, running[0]),
        timeout_s=60,
    )
