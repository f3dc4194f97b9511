"""GangTrainingOperator with ``TIDEFLOW_BACKEND=kubernetes``, through Airflow's real ``dag.test()``.

The pipeline file is the same one that runs locally: only configuration sends
its gang step to the cluster. No API server (or Volcano/Kueue controller) can
run here, so the operator (official ``kubernetes`` client) and its trigger
(``kubernetes_asyncio`` watch), configured by a kubeconfig or an Airflow
connection, talk to the one Kubernetes fake (tests/kubefake). As in a
deployment, the operator runs as the Airflow worker's ServiceAccount and the
trigger as the triggerer's: ``dag.test()`` runs both in this process, so the
trigger's client is made from the triggerer's own kubeconfig (``as_triggerer``),
and deploy/'s RBAC must allow each of them what it calls. The gang object passes
the fake's admission; each watch the trigger opens lets the controllers take
their next step (the first one also compacts the history, so that watch is
answered 410 Gone, as a server does after compaction).
"""

from __future__ import annotations

import contextlib
import json
import os
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gangs.test_gang_operator import run_dag, states
from tests.kubefake import DEPLOY, KubeFake, service_account
from tests.simulated_workers import commit_as_workers
from tideflow.kube.settings import kube_settings_from_env

NS = "tideflow"
WORKER = service_account(NS, "tideflow-airflow-worker")
TRIGGERER = service_account(NS, "tideflow-airflow-triggerer")
CONNECTION = "AIRFLOW_CONN_TIDEFLOW_K8S"


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


class Cluster:
    """The fake, and the credentials of the two Airflow identities."""

    def __init__(self, fake: KubeFake, tmp_path: Path) -> None:
        self.fake = fake
        self.worker = fake.kubeconfig(tmp_path / "worker.kubeconfig", WORKER)
        self.triggerer = fake.kubeconfig(tmp_path / "triggerer.kubeconfig", TRIGGERER)

    def triggerer_env(self) -> dict[str, str]:
        """The triggerer pod's credentials: its kubeconfig, and the Airflow connection when
        one is configured, pointing at it."""
        env = {"KUBECONFIG": str(self.triggerer)}
        if CONNECTION in os.environ:
            connection = json.loads(os.environ[CONNECTION])
            connection["extra"]["kube_config_path"] = str(self.triggerer)
            env[CONNECTION] = json.dumps(connection)
        return env

    def gang_objects(self) -> list[dict[str, Any]]:
        return self.fake.list("batch.volcano.sh/v1alpha1", "Job", NS) + self.fake.list(
            "jobset.x-k8s.io/v1alpha2", "JobSet", NS
        )

    def watches(self) -> list[int]:
        return [r.code for r in self.fake.requests_by(TRIGGERER) if r.verb == "watch"]

    def run_volcano_when_watched(self, *, commits: bool = True) -> None:
        """1st watch: the pods start, and the history is compacted (410); 2nd: they succeed,
        rank 0 having committed a checkpoint (unless not ``commits``)."""

        def start(info: Any) -> None:
            self.fake.volcano.pods_running(info.namespace, info.name)
            self.fake.store.compact()

        def finish(info: Any) -> None:
            if commits:
                commit_as_workers(self.fake.volcano.job(info.namespace, info.name))
            self.fake.volcano.pods_succeeded(info.namespace, info.name)

        self.fake.when_watched(start, finish)

    def run_jobset_when_watched(self) -> None:
        """1st watch: Kueue admits the JobSet and its pods start (410); 2nd: they succeed."""

        def start(info: Any) -> None:
            self.fake.kueue.admit(info.namespace, info.name)
            self.fake.jobset.pods_running(info.namespace, info.name)
            self.fake.store.compact()

        def finish(info: Any) -> None:
            commit_as_workers(
                self.fake.get("jobset.x-k8s.io/v1alpha2", "JobSet", info.name, info.namespace)
            )
            self.fake.jobset.pods_succeeded(info.namespace, info.name)

        self.fake.when_watched(start, finish)


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    from tideflow.operators import cluster as cluster_module

    with KubeFake() as fake:
        fake.apply(DEPLOY / "priority-classes.yaml", DEPLOY / "kueue-queues.yaml")
        # The team queues are state these tests are not about (test_kube_conformance.py).
        fake.seed(DEPLOY / "volcano-queues.yaml")
        state = Cluster(fake, tmp_path)
        original = cluster_module.async_api_client

        @contextlib.asynccontextmanager
        async def as_triggerer() -> AsyncIterator[Any]:
            async with contextlib.AsyncExitStack() as stack:
                with environment(state.triggerer_env()):
                    api = await stack.enter_async_context(original())
                yield api

        monkeypatch.setattr(cluster_module, "async_api_client", as_triggerer)
        monkeypatch.setenv("KUBECONFIG", str(state.worker))
        monkeypatch.setenv("TIDEFLOW_BACKEND", "kubernetes")
        monkeypatch.setenv("TIDEFLOW_K8S_NAMESPACE", NS)
        monkeypatch.setenv("TIDEFLOW_K8S_IMAGE", "registry.example.com/vision/train:7")
        monkeypatch.delenv("TIDEFLOW_K8S_CONN_ID", raising=False)
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield state


def pipeline(
    tmp_path: Path, entrypoint: str = "[python, -m, vision.train]", timeout: str = "null"
) -> Path:
    path = tmp_path / "cluster-gang.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        apiVersion: tideflow/v1
        kind: Pipeline
        metadata: {{name: cluster-gang, team: vision}}
        steps:
          - name: train
            timeout: {timeout}
            gang_training:
              entrypoint: {entrypoint}
              workers: 4
              devices_per_worker: 8
              device: {{class: gpu, model: H100}}
              max_restarts: 2
        """)
    )
    return path


@pytest.mark.processes
@pytest.mark.usefixtures("airflow_home")
def test_gang_step_becomes_one_volcano_job_and_the_task_follows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster: Cluster
) -> None:
    cluster.run_volcano_when_watched()
    dag_run = run_dag(pipeline(tmp_path), monkeypatch)
    assert states(dag_run) == {"train": "success"}
    creates = [r for r in cluster.fake.requests_by(WORKER) if r.method == "POST"]
    assert [(r.resource, r.code) for r in creates] == [("jobs", 201)]
    (job,) = cluster.gang_objects()  # as admitted: schema, Volcano's webhooks, RBAC
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
    env = {e["name"]: e.get("value") for e in container["env"]}  # RANK comes from a fieldRef
    assert (
        env["TIDEFLOW_GANG_ID"].startswith("cluster-gang/")
        and "/checkpoints" in env["TIDEFLOW_CHECKPOINT_URI"]
    )
    (ti,) = dag_run.get_task_instances()
    assert ti.xcom_pull(task_ids="train")["checkpoint_store"] == env["TIDEFLOW_CHECKPOINT_URI"]
    # rank 0 reports to the cluster's MLflow, and artifacts go where the settings say
    settings = kube_settings_from_env()
    assert env["MLFLOW_TRACKING_URI"] == settings.mlflow_tracking_uri
    assert env["TIDEFLOW_ARTIFACT_ROOT"] == settings.artifact_root
    assert job["status"]["state"]["phase"] == "Completed"
    assert cluster.watches() == [410, 200]  # the trigger listed again after 410 Gone
    assert {(r.verb, r.code) for r in cluster.fake.requests_by(TRIGGERER)} == {
        ("list", 200),
        ("watch", 410),
        ("watch", 200),
    }


@pytest.mark.processes
@pytest.mark.usefixtures("airflow_home")
def test_kueue_cluster_through_an_airflow_connection_gets_a_jobset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster: Cluster
) -> None:
    monkeypatch.delenv("KUBECONFIG")  # only the connection knows the way
    connection = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(cluster.worker)}}
    monkeypatch.setenv(CONNECTION, json.dumps(connection))
    monkeypatch.setenv("TIDEFLOW_K8S_CONN_ID", "tideflow_k8s")
    monkeypatch.setenv("TIDEFLOW_K8S_GANG_SCHEDULER", "kueue")
    cluster.run_jobset_when_watched()
    dag_run = run_dag(pipeline(tmp_path), monkeypatch)
    assert states(dag_run) == {"train": "success"}
    (jobset,) = cluster.gang_objects()
    assert jobset["kind"] == "JobSet"
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "vision"
    assert jobset["status"]["terminalState"] == "Completed"
    assert cluster.watches() == [410, 200]


@pytest.mark.processes
@pytest.mark.usefixtures("airflow_home")
def test_module_function_entry_point_is_refused_on_a_cluster_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster: Cluster
) -> None:
    dag_run = run_dag(pipeline(tmp_path, "vision.train:main"), monkeypatch)
    assert states(dag_run) == {"train": "failed"}
    assert [r for r in cluster.fake.requests_by(WORKER) if r.method == "POST"] == []


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
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from tests.kube.test_kube_jobset import gang
    from tests.trigger_helpers import first_event, round_trip
    from tideflow.operators.cluster import cluster_backend
    from tideflow.operators.triggers import ClusterGangTrigger

    cluster_backend().submit(gang())  # as the worker
    cluster.run_volcano_when_watched(commits=False)  # only the trigger runs: no outputs
    trigger = round_trip(ClusterGangTrigger(gang_id=gang().gang_id, deadline=time.time() + 60))
    event = first_event(trigger)
    assert event["status"] == "finished" and '"state": "succeeded"' in event["gang"]
    assert cluster.watches() == [410, 200]  # 410 Gone: listed again, watched again
    missing = ClusterGangTrigger(gang_id="never/run/train", deadline=time.time() + 60)
    assert first_event(round_trip(missing)) == {"status": "unknown", "gang_id": "never/run/train"}


def test_cluster_gang_trigger_on_kill_deletes_the_gang_object(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Airflow calls on_kill when a user marks the deferred task failed or clears it; the
    triggerer deletes the gang with its own identity."""
    import asyncio
    import time

    from tests.kube.test_kube_jobset import gang
    from tests.trigger_helpers import round_trip
    from tideflow.operators.cluster import cluster_backend
    from tideflow.operators.triggers import ClusterGangTrigger

    cluster_backend().submit(gang())  # as the worker
    assert len(cluster.gang_objects()) == 1
    monkeypatch.setenv("KUBECONFIG", str(cluster.triggerer))  # the triggerer's pod
    trigger = round_trip(ClusterGangTrigger(gang_id=gang().gang_id, deadline=time.time() + 60))
    asyncio.run(trigger.on_kill())
    assert cluster.gang_objects() == []
    (delete,) = cluster.fake.requests_by(TRIGGERER)
    assert (delete.verb, delete.code) == ("delete", 200)


@pytest.mark.processes
@pytest.mark.usefixtures("airflow_home")
def test_a_preempted_volcano_gang_resumes_as_one_job_without_using_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster: Cluster
) -> None:
    """The broker evicts the running gang; its workers checkpoint and exit 75, Volcano aborts
    the Job, the trigger reports it preempted, and the task replaces the aborted Job with
    one that still allows both restarts; the second incarnation completes."""
    from tideflow.kube.volcano import EXIT_PREEMPTED

    cluster.fake.pods.termination_exit_code = EXIT_PREEMPTED

    def start_and_preempt(info: Any) -> None:
        # the broker's eviction (test_kube_conformance.py makes it through the API; here the
        # fake is inside a watch request, so its effect is applied directly)
        cluster.fake.volcano.pods_running(info.namespace, info.name)
        job = cluster.fake.volcano.job(info.namespace, info.name)
        for pod in cluster.fake.volcano.pods(job):
            cluster.fake.pods.delete(pod, evicted=True)
        cluster.fake.pods.finish_terminating(info.namespace)

    def run_to_completion(info: Any) -> None:
        cluster.fake.volcano.pods_running(info.namespace, info.name)
        commit_as_workers(cluster.fake.volcano.job(info.namespace, info.name))
        cluster.fake.volcano.pods_succeeded(info.namespace, info.name)

    cluster.fake.when_watched(start_and_preempt, run_to_completion)
    dag_run = run_dag(pipeline(tmp_path), monkeypatch)
    assert states(dag_run) == {"train": "success"}
    calls = [(r.verb, r.code) for r in cluster.fake.requests_by(WORKER) if r.verb != "get"]
    assert calls == [("create", 201), ("delete", 200), ("create", 201)]
    (job,) = cluster.gang_objects()  # the replacement, under the same name
    assert job["spec"]["maxRetry"] == 3  # both restarts still left
    assert job["status"]["state"]["phase"] == "Completed"
    (ti,) = dag_run.get_task_instances()
    assert ti.xcom_pull(task_ids="train")["restarts"] == 0


@pytest.mark.processes
@pytest.mark.usefixtures("airflow_home")
@pytest.mark.timeout(180)
def test_a_cluster_gang_step_past_its_timeout_deletes_its_gang(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cluster: Cluster,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The pods start and never finish (a hang); the step's timeout ends the task and
    deletes the Volcano Job with its pods, through the worker's own identity."""

    def start(info: Any) -> None:
        cluster.fake.volcano.pods_running(info.namespace, info.name)

    cluster.fake.when_watched(start)
    dag_run = run_dag(pipeline(tmp_path, timeout="8s"), monkeypatch)
    assert states(dag_run) == {"train": "failed"}
    assert "ran past its timeout (0:00:08): gang cluster-gang/" in capfd.readouterr().out
    assert cluster.gang_objects() == []
    deletes = [r for r in cluster.fake.requests_by(WORKER) if r.method == "DELETE"]
    assert [(r.resource, r.code) for r in deletes] == [("jobs", 200)]


TEAMS_CLUSTER = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: prio}
nodes:
  - {name: h100, count: 4, cpu: 64, memory: 512Gi,
     accelerators: {class: gpu, model: H100, count: 8}}
priority_classes:
  - {name: urgent, value: 1000, preempts: true}
  - {name: batch, value: 0}
teams:
  - name: vision
    quota: [{device: gpu, model: H100, nominal: 32}]
    default_priority_class: batch
"""


@pytest.mark.processes
@pytest.mark.usefixtures("airflow_home")
def test_a_cluster_gang_of_a_team_with_a_default_class_names_it_to_kueue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster: Cluster
) -> None:
    """The run names no class: the team's default (the cluster file's) is the gang's,
    as on the local ledger, and the JobSet names the WorkloadPriorityClass that
    `tideflow compile --target kueue` made of it (the fake admits it only if it exists)."""
    import yaml

    from tideflow.cli import main

    cluster_file = tmp_path / "teams-cluster.yaml"
    cluster_file.write_text(TEAMS_CLUSTER)
    compiled = tmp_path / "kueue.yaml"
    assert main(["compile", "--target", "kueue", str(cluster_file), "-o", str(compiled)]) == 0
    classes = tmp_path / "classes.yaml"
    classes.write_text(
        yaml.safe_dump_all(
            d
            for d in yaml.safe_load_all(compiled.read_text())
            if d and d["kind"] == "WorkloadPriorityClass"
        )
    )
    cluster.fake.apply(classes)
    monkeypatch.setenv("TIDEFLOW_CLUSTER_FILE", str(cluster_file))
    monkeypatch.setenv("TIDEFLOW_K8S_GANG_SCHEDULER", "kueue")
    cluster.run_jobset_when_watched()
    dag_run = run_dag(pipeline(tmp_path), monkeypatch)
    assert states(dag_run) == {"train": "success"}
    (jobset,) = cluster.gang_objects()
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "batch"
