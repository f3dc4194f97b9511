"""A gang's workers on a cluster get the step context files a data-prep step gets.

``$TIDEFLOW_STEP_CONTEXT`` and ``$TIDEFLOW_STEP_ARGS`` name files that the pod's
downward-API volume makes from its template's annotations (so the image needs
no tideflow to write them); ``$TIDEFLOW_STEP_OUTPUTS`` is a file of the pod's
own. Checked on the pods the one Kubernetes fake's Volcano and JobSet
controllers make (tests/kubefake), reading each file as the kubelet would, and
through the Argo gang step's driver. The local backend's workers:
tests/gangs/test_user_code.py.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kubefake import DEPLOY, KubeFake, service_account
from tests.kubefake.pods import container_environment
from tideflow.backends.kubernetes import KubernetesBackend
from tideflow.checkpoint import CheckpointManager
from tideflow.compile.gang_plan import gang_plan_from_json
from tideflow.gangs import resolve_gang
from tideflow.gangs.driver import main
from tideflow.kube import KubeSettings
from tideflow.kube.settings import settings_to_json
from tideflow.steps.context import StepContext

NS = "tideflow"
WORKER = service_account(NS, "tideflow-airflow-worker")
DRIVER = service_account(NS, "tideflow-argo-gang-driver")
CONFIG = {
    "entrypoint": ["python", "-m", "vision.train"],
    "args": {"lr": 0.1, "fp16": True},
    "workers": 2,
    "devices_per_worker": 1,
    "device": {"class": "gpu", "model": "H100"},
    "max_restarts": 1,
}
_ANNOTATION = re.compile(r"^metadata\.annotations\['(.+)'\]$")


@pytest.fixture
def fake() -> Iterator[KubeFake]:
    with KubeFake() as cluster:
        cluster.apply(DEPLOY / "priority-classes.yaml")
        cluster.seed(DEPLOY / "volcano-queues.yaml", DEPLOY / "kueue-queues.yaml")
        yield cluster


def pod_files(pod: dict[str, Any]) -> dict[str, str]:
    """The files the kubelet puts into the worker container from downward-API volumes."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or [] if "downwardAPI" in v}
    annotations = pod["metadata"].get("annotations") or {}
    files = {}
    (container,) = pod["spec"]["containers"]
    for mount in container.get("volumeMounts") or []:
        for item in volumes.get(mount["name"], {}).get("downwardAPI", {}).get("items", []):
            key = _ANNOTATION.match(item["fieldRef"]["fieldPath"])
            assert key, item
            files[f"{mount['mountPath']}/{item['path']}"] = annotations[key.group(1)]
    return files


def context(run_id: str) -> StepContext:
    return StepContext(
        pipeline="vision-train",
        team="vision",
        step="train",
        dag_id="vision-train",
        run_id=run_id,
        try_number=1,
        artifact_root="s3://tideflow/artifacts",
        params={"lr": 0.1, "size": "large"},
    )


def assert_worker_reads_its_step_files(pod: dict[str, Any], ctx: StepContext) -> None:
    env = container_environment(pod)
    files = pod_files(pod)
    assert StepContext.from_json(files[env["TIDEFLOW_STEP_CONTEXT"]]) == ctx
    assert json.loads(files[env["TIDEFLOW_STEP_ARGS"]]) == {"lr": 0.1, "fp16": True}
    assert env["TIDEFLOW_STEP_OUTPUTS"].startswith("/tmp/")  # the pod's own, writable


@pytest.mark.parametrize("scheduler", ["volcano", "kueue"])
def test_the_controllers_pods_get_the_step_context_files(fake: KubeFake, scheduler: str) -> None:
    settings = KubeSettings(namespace=NS, gang_scheduler=scheduler)
    run_id = "manual__2026-11-23T12:00:00+00:00"
    gang = resolve_gang(
        gang_plan_from_json(CONFIG),
        pipeline="vision-train",
        team="vision",
        run_id=run_id,
        step="train",
        artifact_root="s3://tideflow/artifacts",
        allowed_roots=(),
    )
    ctx = context(run_id)
    backend = KubernetesBackend(fake.client(WORKER), settings)
    backend.submit(gang.cluster_job(context=ctx))  # as the operator submits it
    name = backend.job_name(gang.gang_id)
    if scheduler == "volcano":
        fake.volcano.pods_running(NS, name)
    else:
        fake.kueue.admit(NS, name)
        fake.jobset.pods_running(NS, name)
    pods = fake.list("v1", "Pod", NS)
    assert len(pods) == 2
    for pod in pods:
        assert_worker_reads_its_step_files(pod, ctx)


def test_without_a_context_the_pods_get_no_step_files(fake: KubeFake) -> None:
    gang = resolve_gang(
        gang_plan_from_json(CONFIG),
        pipeline="p",
        team="vision",
        run_id="r",
        step="train",
        artifact_root="s3://tideflow/artifacts",
        allowed_roots=(),
    )
    job = KubernetesBackend(fake.client(WORKER), KubeSettings(namespace=NS)).manifest(
        gang.cluster_job()
    )
    template = job["spec"]["tasks"][0]["template"]
    assert "annotations" not in template["metadata"] and "volumes" not in template["spec"]


def test_the_argo_gang_drivers_pods_get_the_workflows_context(
    fake: KubeFake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tideflow.gangs.driver.POLL_S", 0.05)
    root = (tmp_path / "artifacts").as_uri()
    settings = KubeSettings(namespace=NS, artifact_root=root)
    run_id = "vision-train-x7k2p"
    argv = [
        "gang_training",
        *("--pipeline", "vision-train", "--team", "vision", "--step", "train"),
        *("--run-id", run_id, "--attempt", "1"),
        *("--config", json.dumps(CONFIG), "--set", "args/lr:float=0.1"),
        *("--param", "lr:float=0.1", "--param", "size:str=large"),
        *("--kube-settings", settings_to_json(settings), "--outputs", str(tmp_path / "out")),
    ]
    seen: list[dict[str, Any]] = []

    def run_the_gang() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            jobs = fake.list("batch.volcano.sh/v1alpha1", "Job", NS)
            if jobs:
                name = jobs[0]["metadata"]["name"]
                fake.volcano.pods_running(NS, name)
                seen.extend(fake.list("v1", "Pod", NS))
                env = container_environment(seen[0])
                CheckpointManager(env["TIDEFLOW_CHECKPOINT_URI"]).save(1, {"model.pt": b"w"})
                fake.volcano.pods_succeeded(NS, name)
                return
            time.sleep(0.05)

    worker = threading.Thread(target=run_the_gang, daemon=True)
    worker.start()
    assert main(argv, api_client=fake.client(DRIVER)) == 0
    worker.join(5)
    ctx = StepContext(
        pipeline="vision-train",
        team="vision",
        step="train",
        dag_id="vision-train",
        run_id=run_id,
        try_number=2,  # Argo's second attempt
        artifact_root=root,
        params={"lr": 0.1, "size": "large"},
    )
    assert len(seen) == 2
    for pod in seen:
        assert_worker_reads_its_step_files(pod, ctx)
        (container,) = pod["spec"]["containers"]
        assert container["command"] == ["python", "-m", "vision.train", "--fp16", "--lr", "0.1"]
