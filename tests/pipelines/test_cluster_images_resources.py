"""On a cluster: each step's image (the step's, else the pipeline's, else the platform's),
the pipeline's code from inside the image, and gang workers' CPU and memory.

Argo steps and their gang driver, Volcano Job and JobSet pods (submitted through
the Kubernetes backend and admitted by the one Kubernetes fake, tests/kubefake,
which validates them as upstream does), the operator's cluster gang and the
KubernetesExecutor's task pods.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.argo_run import templates
from tests.kubefake import DEPLOY, KubeFake, service_account
from tideflow.argo import compile_pipeline
from tideflow.backends.kubernetes import KubernetesBackend
from tideflow.compile.dag_plan import compile_dag_plan
from tideflow.compile.gang_plan import gang_plan_from_json
from tideflow.gangs import resolve_gang
from tideflow.kube import KubeSettings
from tideflow.spec import load_pipeline

NS = "tideflow"
WORKER = service_account(NS, "tideflow-airflow-worker")
PLATFORM = KubeSettings().image
BASE = "registry.example.com/vision/base:2.1"
TRAIN = "registry.example.com/vision/train:7"
PIPELINE = f"""\
apiVersion: tideflow/v1
kind: Pipeline
metadata: {{name: vision, team: vision}}
params:
  lr: {{type: float, default: 0.5}}
image: {BASE}
code: {{path: ../src, image_path: /opt/vision/src}}
steps:
  - name: prep
    data_prep:
      entrypoint: vision.prep:run
      env: {{PYTHONPATH: /opt/extra}}
      outputs: [table]
  - name: train
    needs: [prep]
    image: {TRAIN}
    gang_training:
      entrypoint: [python, -m, vision.train]
      args: {{lr: "{{{{ params.lr }}}}", fp16: true, debug: false}}
      workers: 2
      devices_per_worker: 4
      device: {{class: gpu, model: H100}}
      resources: {{cpu: 12, memory: 96Gi}}
  - name: evaluate
    needs: [train]
    evaluation: {{entrypoint: "vision.eval:score", devices: [cpu], metrics: [accuracy]}}
  - name: promote
    needs: [evaluate]
    promote_checkpoint:
      model: vision-model
      builder: vision.build:log_model
      gate: {{metric: accuracy}}
"""


@pytest.fixture
def vision(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "pipelines").mkdir()
    path = tmp_path / "pipelines" / "vision.yaml"
    path.write_text(PIPELINE)
    return path


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item.get("value", "") for item in container["env"]}


# -- Argo ---------------------------------------------------------------------------------------


def test_argo_steps_run_in_their_images_with_the_code_from_the_image(vision: Path) -> None:
    workflow = yaml.safe_load(compile_pipeline(vision, settings=KubeSettings())[1])
    steps = templates(workflow)
    images = {name: t["container"]["image"] for name, t in steps.items() if "container" in t}
    assert images == {
        "prep": BASE,
        "evaluate": BASE,
        "promote": BASE,
        # tideflow's own containers: the gang driver and the exit handler
        "train": PLATFORM,
        "pipeline-end": PLATFORM,
    }
    pythonpath = {
        name: env_of(steps[name]["container"]).get("PYTHONPATH")
        for name in ("prep", "evaluate", "promote", "train", "pipeline-end")
    }
    assert pythonpath == {
        "prep": "/opt/vision/src:/opt/extra",  # the image's copy first, then the step's own
        "evaluate": "/opt/vision/src",
        "promote": "/opt/vision/src",  # the builder imports the pipeline's modules
        "train": None,
        "pipeline-end": None,
    }
    # No path of this machine goes into the workflow.
    assert str(vision.parent.parent) not in json.dumps(workflow)


def test_the_argo_gang_drivers_workers_get_the_step_image_code_args_and_resources(
    vision: Path,
) -> None:
    """The driver's arguments, as Argo passes them, resolved as the driver resolves them."""
    from tideflow.backends.kubernetes import gang_object
    from tideflow.steps.standalone_io import build_parser, read_step

    workflow = yaml.safe_load(compile_pipeline(vision, settings=KubeSettings())[1])
    args = templates(workflow)["train"]["container"]["args"]
    filled = [a.replace("{{workflow.parameters.lr}}", "0.5") for a in args]
    parser = build_parser(("gang_training",), "driver")
    parser.add_argument("--kube-settings")
    parser.add_argument("--owner-name")
    parser.add_argument("--owner-uid")
    config, _ = read_step(parser.parse_args(filled))
    gang = resolve_gang(
        gang_plan_from_json(config),
        pipeline="vision",
        team="vision",
        run_id="wf-1",
        step="train",
        artifact_root="s3://tideflow/artifacts",
        allowed_roots=("s3://tideflow/artifacts",),
    )
    pod = gang_object(gang.cluster_job(), KubeSettings())["spec"]["tasks"][0]["template"]["spec"]
    (worker,) = pod["containers"]
    assert worker["image"] == TRAIN
    assert worker["command"] == ["python", "-m", "vision.train", "--fp16", "--lr", "0.5"]
    assert env_of(worker)["PYTHONPATH"] == "/opt/vision/src"
    assert worker["resources"] == {
        "requests": {"nvidia.com/gpu": "4", "cpu": "12", "memory": "96Gi"},
        "limits": {"nvidia.com/gpu": "4", "memory": "96Gi"},
    }


# -- Volcano and JobSet, through the backend and the fake ---------------------------------------


def cluster_gang(vision: Path) -> Any:
    """The train step as the operator resolves it on a cluster (its kwargs from the DAG)."""
    plan = compile_dag_plan(load_pipeline(vision))
    (task,) = [t for t in plan.tasks if t.gang is not None]
    assert task.gang is not None
    rendered = replace(task.gang, args={"lr": 0.5, "fp16": True, "debug": False})
    return resolve_gang(
        rendered,
        pipeline="vision",
        team="vision",
        run_id="manual__2026-11-23T12:00:00+00:00",
        step="train",
        artifact_root="s3://tideflow/artifacts",
        allowed_roots=("s3://tideflow/artifacts",),
        code_path=plan.code_path,
    )


@pytest.fixture
def fake() -> Iterator[KubeFake]:
    with KubeFake() as cluster:
        cluster.apply(DEPLOY / "priority-classes.yaml")
        cluster.seed(DEPLOY / "volcano-queues.yaml", DEPLOY / "kueue-queues.yaml")
        yield cluster


def pod_template(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "Job":
        spec: dict[str, Any] = obj["spec"]["tasks"][0]["template"]["spec"]
        return spec
    spec = obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize("scheduler", ["volcano", "kueue"])
def test_gang_pods_request_the_workers_cpu_and_memory_as_admitted_by_the_fake(
    vision: Path, fake: KubeFake, scheduler: str
) -> None:
    settings = KubeSettings(namespace=NS, gang_scheduler=scheduler)
    backend = KubernetesBackend(fake.client(WORKER), settings)
    gang = cluster_gang(vision)
    backend.submit(gang.cluster_job())
    name = backend.job_name(gang.gang_id)
    admitted = (
        fake.volcano.job(NS, name) if scheduler == "volcano" else fake.jobset.jobset(NS, name)
    )
    (worker,) = pod_template(admitted)["containers"]
    assert worker["resources"]["requests"] == {"nvidia.com/gpu": "4", "cpu": "12", "memory": "96Gi"}
    assert worker["resources"]["limits"] == {"nvidia.com/gpu": "4", "memory": "96Gi"}
    assert worker["image"] == TRAIN
    assert worker["command"] == ["python", "-m", "vision.train", "--fp16", "--lr", "0.5"]
    env = env_of(worker)
    assert env["PYTHONPATH"] == "/opt/vision/src"  # never this machine's directory
    assert str(vision.parent.parent) not in json.dumps(admitted)


@pytest.mark.parametrize("scheduler", ["volcano", "kueue"])
def test_the_fake_validates_the_workers_quantities(
    vision: Path, fake: KubeFake, scheduler: str
) -> None:
    """What the backend's pods ask for is checked: a quantity Kubernetes would not take
    (the spec never lets one through) is refused at the pod template's field."""
    import dataclasses

    from tests.kubefake.status import ApiError
    from tideflow.backends.kubernetes import gang_object

    job = dataclasses.replace(cluster_gang(vision).cluster_job(), memory="96 GB")
    obj = gang_object(job, KubeSettings(namespace=NS, gang_scheduler=scheduler))
    with pytest.raises(ApiError, match=r"resources\.requests\.memory: '96 GB' does not match"):
        fake.create(obj, WORKER)


def test_without_resources_or_images_the_gang_pods_are_as_before(repo: Path) -> None:
    from tests.kube.test_kube_volcano import job

    (worker,) = job(repo)["spec"]["tasks"][0]["template"]["spec"]["containers"]
    assert worker["image"] == PLATFORM
    assert worker["resources"] == {"requests": {"cpu": "1"}, "limits": {}}
    assert "PYTHONPATH" not in env_of(worker)


# -- the operator's cluster path and the KubernetesExecutor's task pods -------------------------


def test_the_gang_operator_hands_image_resources_and_code_to_its_cluster_gang(
    vision: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tideflow.dag.builder import build_dag

    monkeypatch.delenv("TIDEFLOW_BACKEND", raising=False)
    train = build_dag(compile_dag_plan(load_pipeline(vision))).get_task("train")
    train.args = {"lr": 0.5, "fp16": True, "debug": False}  # rendered
    gang = resolve_gang(
        train.step_plan(),
        pipeline="vision",
        team="vision",
        run_id="r",
        step="train",
        artifact_root="s3://tideflow/artifacts",
        allowed_roots=("s3://tideflow/artifacts",),
        code_path=train.code_path,
    )
    job = gang.cluster_job()
    assert (job.image, job.cpu, job.memory) == (TRAIN, "12", "96Gi")
    assert job.env["PYTHONPATH"] == "/opt/vision/src"
    assert job.command[-3:] == ("--fp16", "--lr", "0.5")
    # locally, the same gang runs with this machine's directory
    assert gang.local_env()["PYTHONPATH"].split(":")[0] == str(vision.parent.parent / "src")


def test_task_pods_run_in_the_step_image_and_the_gang_pod_in_airflows(
    vision: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kubernetes_validate
    from kubernetes.client import ApiClient

    from tideflow.dag.builder import build_dag

    monkeypatch.setenv("TIDEFLOW_BACKEND", "kubernetes")
    monkeypatch.delenv("TIDEFLOW_CLUSTER_FILE", raising=False)
    dag = build_dag(compile_dag_plan(load_pipeline(vision)))
    pods = {
        t.task_id: ApiClient().sanitize_for_serialization(t.executor_config["pod_override"])
        for t in dag.tasks
    }
    images = {name: pod["spec"]["containers"][0].get("image") for name, pod in pods.items()}
    # the gang's task pod only submits the gang (whose workers get the step's image)
    assert images == {"prep": BASE, "evaluate": BASE, "promote": BASE, "train": None}
    for override in pods.values():
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, **override}
        pod["spec"]["containers"][0].setdefault("image", "airflow")
        kubernetes_validate.validate(pod, "1.33", strict=True)


def test_without_an_image_task_pods_keep_airflows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tideflow.dag.builder import build_dag

    path = tmp_path / "plain.yaml"
    path.write_text(
        textwrap.dedent("""\
        apiVersion: tideflow/v1
        kind: Pipeline
        metadata: {name: plain, team: qa}
        steps:
          - name: prep
            data_prep: {entrypoint: "m:f"}
        """)
    )
    monkeypatch.setenv("TIDEFLOW_BACKEND", "kubernetes")
    (task,) = build_dag(compile_dag_plan(load_pipeline(path))).tasks
    assert task.executor_config["pod_override"].spec.containers[0].image is None
