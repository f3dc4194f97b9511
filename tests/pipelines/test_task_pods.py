"""On Kubernetes (KubernetesExecutor), each step's Airflow task pod lands on its pool.

The DAG is built as the dag-processor builds it with ``TIDEFLOW_BACKEND=kubernetes``;
every task's ``pod_override`` is checked and validated strictly as a core Pod
(kubernetes-validate), and must survive Airflow's DAG serialization.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

CLUSTER = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: gpus-only}
nodes:
  - {name: h100-0, cpu: 64, accelerators: {class: gpu, model: H100, count: 8}}
"""


def digits_dag(repo: Path, monkeypatch: pytest.MonkeyPatch, cluster: Path | None) -> Any:
    from tideflow.compile.dag_plan import compile_dag_plan
    from tideflow.dag.builder import build_dag
    from tideflow.spec import load_pipeline

    monkeypatch.setenv("TIDEFLOW_BACKEND", "kubernetes")
    if cluster is None:
        monkeypatch.delenv("TIDEFLOW_CLUSTER_FILE", raising=False)
    else:
        monkeypatch.setenv("TIDEFLOW_CLUSTER_FILE", str(cluster))
    return build_dag(compile_dag_plan(load_pipeline(repo / "pipelines" / "digits.yaml")))


def pods(dag: Any) -> dict[str, dict[str, Any]]:
    from kubernetes.client import ApiClient

    return {
        task.task_id: ApiClient().sanitize_for_serialization(task.executor_config["pod_override"])
        for task in dag.tasks
    }


def test_each_step_pod_is_placed_on_its_pool(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = pods(digits_dag(repo, monkeypatch, None))
    prep = found["prepare-data"]["spec"]
    assert prep["nodeSelector"] == {"tideflow.io/pool": "cpu"}
    (base,) = prep["containers"]
    assert base["name"] == "base"  # Airflow's task container
    assert base["resources"]["requests"] == {"cpu": "1", "memory": "1Gi"}
    # digits evaluates on [npu, gpu-spare, cpu]: without an inventory, the first
    evaluate = found["evaluate"]["spec"]
    assert evaluate["nodeSelector"] == {"tideflow.io/pool": "npu"}
    assert evaluate["containers"][0]["resources"]["limits"]["huawei.com/Ascend910"] == "1"
    for name in ("train", "promote"):  # they only talk to APIs
        assert found[name]["spec"]["nodeSelector"] == {"tideflow.io/pool": "cpu"}
    for pod in found.values():
        assert {"key": "tideflow.io/pool", "operator": "Exists", "effect": "NoSchedule"} in pod[
            "spec"
        ]["tolerations"]
        assert pod["spec"]["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_task_pods_are_labelled_as_mlflow_clients(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tideflow.kube.pods import MLFLOW_CLIENT_LABEL

    # deploy/kubernetes/mlflow.yaml admits pods with this label only; the Helm values
    # give it to every Airflow pod, and each step's override carries it too.
    for name, pod in pods(digits_dag(repo, monkeypatch, None)).items():
        assert pod["metadata"]["labels"][MLFLOW_CLIENT_LABEL] == "true", name


def test_evaluation_takes_a_spare_gpu_where_the_cluster_has_no_npu(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER)
    evaluate = pods(digits_dag(repo, monkeypatch, cluster))["evaluate"]["spec"]
    assert evaluate["priorityClassName"] == "tideflow-spare"  # preempted first
    terms = evaluate["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (term,) = terms["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["values"] == ["training", "inference"]
    assert evaluate["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    env = {e["name"]: e["value"] for e in evaluate["containers"][0]["env"]}
    assert env["TIDEFLOW_DEVICE_CLASS"] == "gpu"


@pytest.mark.parametrize("with_cluster", [False, True])
def test_task_pods_are_admitted_as_core_pods_and_survive_dag_serialization(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_cluster: bool
) -> None:
    """Each override, completed as the KubernetesExecutor completes it (image, name), is
    created in the one Kubernetes fake (tests/kubefake): strict core-schema validation, and
    its PriorityClass must be one deploy/ defines (the Priority admission plugin)."""
    from airflow.serialization.serialized_objects import DagSerialization

    from tests.kubefake import DEPLOY, KubeFake
    from tideflow.settings_registry.declared_kubernetes import DEFAULT_IMAGE

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER)
    dag = digits_dag(repo, monkeypatch, cluster if with_cluster else None)
    with KubeFake() as fake:
        fake.apply(DEPLOY / "priority-classes.yaml")
        for task_id, pod in pods(dag).items():
            pod["spec"]["containers"][0]["image"] = DEFAULT_IMAGE
            pod["metadata"] = {**pod["metadata"], "name": task_id, "namespace": "tideflow"}
            created = fake.create({"apiVersion": "v1", "kind": "Pod", **pod})
            assert created["spec"]["priority"] is not None
    if with_cluster:
        return
    restored = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    override = restored.get_task("evaluate").executor_config["pod_override"]
    assert override.spec.node_selector == {"tideflow.io/pool": "npu"}


def test_locally_no_pod_is_configured(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tideflow.compile.dag_plan import compile_dag_plan
    from tideflow.dag.builder import build_dag
    from tideflow.spec import load_pipeline

    monkeypatch.delenv("TIDEFLOW_BACKEND", raising=False)
    dag = build_dag(compile_dag_plan(load_pipeline(repo / "pipelines" / "digits.yaml")))
    assert all(not task.executor_config for task in dag.tasks)
