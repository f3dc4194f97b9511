"""An Argo-run gang carries the priority class the Airflow operator would give it.

The run's class when the workflow's ``priority_class`` parameter names one (the
param the DAG has when the pipeline names ``metadata.priority_class``), checked
against the classes the cluster file lets the team use; else the team's
``default_priority_class``. The workflow is compiled against the cluster file, as
``tideflow compile --target argo --cluster FILE`` does, and its gang step's
container (tideflow's gang driver) runs as a child process with Argo's variables
filled in (tests/argo_run.py) and its ServiceAccount's token for tests/kubefake,
which stands in for the API server (no real one runs here) and admits the JobSet
by the JobSet and Kueue webhook rules, with the WorkloadPriorityClasses that
``tideflow compile --target kueue`` makes of the same cluster file applied.
"""

from __future__ import annotations

import signal
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.argo_run import start_gang_driver, templates
from tests.kube.test_kube_priority_class import compiled
from tests.kubefake import KubeFake, gang_cluster
from tideflow.argo import compile_pipeline
from tideflow.inventory import inventory_for
from tideflow.kube import KubeSettings

pytestmark = pytest.mark.processes

NS = "tideflow"
LABEL = "kueue.x-k8s.io/priority-class"
JOBSETS = ("jobset.x-k8s.io/v1alpha2", "JobSet")
VOLCANO_JOBS = ("batch.volcano.sh/v1alpha1", "Job")

CLUSTER = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: prio}
nodes:
  - {name: h100, count: 2, cpu: 64, memory: 512Gi,
     accelerators: {class: gpu, model: H100, count: 8},
     labels: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}}
priority_classes:
  - {name: urgent, value: 1000, preempts: true}
  - {name: high, value: 500}
  - {name: normal, value: 100}
  - {name: batch, value: 0}
teams:
  - name: vision
    quota: [{device: gpu, model: H100, nominal: 8}]
    priority_classes: [high, normal, batch]
    default_priority_class: batch
"""


def pipeline_text(priority_class: str | None) -> str:
    named = f", priority_class: {priority_class}" if priority_class else ""
    return textwrap.dedent(
        f"""\
        apiVersion: tideflow/v1
        kind: Pipeline
        metadata: {{name: vision-train, team: vision{named}}}
        steps:
          - name: train
            gang_training:
              entrypoint: [python, -m, vision.train]
              workers: 1
              device: {{class: gpu, model: H100}}
        """
    )


@pytest.fixture
def cluster_file(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER)
    return path


@pytest.fixture
def fake(cluster_file: Path) -> Iterator[KubeFake]:
    with gang_cluster() as cluster:
        # Kueue's queues and WorkloadPriorityClasses; Volcano's PriorityClasses (its team
        # queues are gang_cluster's, seeded from deploy/).
        cluster.apply(*compiled(cluster_file, "kueue"))
        cluster.apply(
            *(o for o in compiled(cluster_file, "volcano") if o["kind"] == "PriorityClass")
        )
        yield cluster


def workflow(
    tmp_path: Path, cluster_file: Path, priority_class: str | None, scheduler: str = "kueue"
) -> dict[str, Any]:
    """The compiled WorkflowTemplate of the vision team's pipeline, as an object."""
    path = tmp_path / "vision-train.yaml"
    path.write_text(pipeline_text(priority_class))
    settings = KubeSettings(
        namespace=NS, gang_scheduler=scheduler, artifact_root=(tmp_path / "art").as_uri()
    )
    text = compile_pipeline(path, settings=settings, inventory=inventory_for(cluster_file))[1]
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


def parameters(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    """The WorkflowTemplate's parameters (none: no ``arguments`` at all)."""
    return list(workflow["spec"].get("arguments", {}).get("parameters", []))


def run_driver(
    fake: KubeFake, workflow: dict[str, Any], folder: Path, kind: tuple[str, str], **params: str
) -> tuple[dict[str, Any] | None, int | None, str]:
    """Start the gang step's driver for a run with ``params``; return the gang object it
    created (None if it created none), the driver's exit code (None: it was still
    following its gang, and was stopped) and what it printed."""
    train = templates(workflow)["train"]
    values = {p["name"]: p["value"] for p in parameters(workflow)} | params
    scope = {
        "workflow.name": "vision-train-x7k2p",
        "workflow.uid": "uid-vision-train-x7k2p",
        "retries": "0",
        **{f"workflow.parameters.{k}": v for k, v in values.items()},
    }
    driver = start_gang_driver(train, scope, folder, {}, fake)
    created: dict[str, Any] | None = None
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and driver.poll() is None:
            found = fake.list(*kind, NS)
            if found:
                created = found[0]
                break
            time.sleep(0.1)
        code = driver.poll()
        if code is None:
            driver.send_signal(signal.SIGTERM)
        out, _ = driver.communicate(timeout=30)
    finally:
        if driver.poll() is None:
            driver.kill()
    return created, code, out


def test_a_jobset_of_a_run_that_names_no_class_carries_the_teams_default(
    fake: KubeFake, cluster_file: Path, tmp_path: Path
) -> None:
    """The pipeline names no class, so its workflow has no priority_class parameter: the
    team's default (``batch``) labels the JobSet, as the operator labels it, and Kueue
    takes the workload's priority from that WorkloadPriorityClass (kueue site/content/
    en/docs/concepts/workload_priority_class.md)."""
    compiled = workflow(tmp_path, cluster_file, None)
    assert "priority_class" not in {p["name"] for p in parameters(compiled)}
    jobset, code, out = run_driver(fake, compiled, tmp_path / "run", JOBSETS)
    assert jobset is not None, out
    assert jobset["metadata"]["labels"].get(LABEL) == "batch", out
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "vision"
    wpc = fake.get("kueue.x-k8s.io/v1beta2", "WorkloadPriorityClass", "batch", "")
    assert wpc is not None and wpc["value"] == 0
    assert code is None, out  # it was following its gang when stopped


def test_a_volcano_job_of_a_run_that_names_no_class_carries_the_teams_default(
    fake: KubeFake, cluster_file: Path, tmp_path: Path
) -> None:
    """On Volcano the class is the Job's ``spec.priorityClassName``: the PriorityClass
    that ``tideflow compile --target volcano`` made of the team's default."""
    compiled = workflow(tmp_path, cluster_file, None, scheduler="volcano")
    job, code, out = run_driver(fake, compiled, tmp_path / "run", VOLCANO_JOBS)
    assert job is not None, out
    assert job["spec"]["priorityClassName"] == "batch", out
    assert code is None, out


def test_the_workflows_priority_class_parameter_overrides_the_pipelines_class(
    fake: KubeFake, cluster_file: Path, tmp_path: Path
) -> None:
    """A pipeline naming ``metadata.priority_class`` gives its workflow a
    ``priority_class`` parameter defaulting to it (as its DAG gets a param); a run that
    sets it to another class the team may use gets that class, one that leaves it gets
    the pipeline's."""
    compiled = workflow(tmp_path, cluster_file, "normal")
    (param,) = [p for p in parameters(compiled) if p["name"] == "priority_class"]
    assert param["value"] == "normal"
    jobset, _, out = run_driver(fake, compiled, tmp_path / "default", JOBSETS)
    assert jobset is not None and jobset["metadata"]["labels"].get(LABEL) == "normal", out
    _wait_until_gone(fake)
    jobset, code, out = run_driver(
        fake, compiled, tmp_path / "override", JOBSETS, priority_class="high"
    )
    assert jobset is not None and jobset["metadata"]["labels"].get(LABEL) == "high", out
    assert code is None, out


def test_a_class_the_team_may_not_use_is_refused_before_any_gang_exists(
    fake: KubeFake, cluster_file: Path, tmp_path: Path
) -> None:
    """``urgent`` is declared, but the team may use high, normal and batch only: the
    driver says so and exits 2 (bad arguments), creating no JobSet."""
    compiled = workflow(tmp_path, cluster_file, "normal")
    jobset, code, out = run_driver(
        fake, compiled, tmp_path / "refused", JOBSETS, priority_class="urgent"
    )
    assert jobset is None, out
    assert code == 2, out
    assert (
        "tideflow: step 'train': team 'vision' may not use priority class 'urgent'; "
        "it may use high, normal, batch"
    ) in out
    assert fake.list(*JOBSETS, NS) == []


def _wait_until_gone(fake: KubeFake) -> None:
    """Until the stopped driver's JobSet is deleted (its pods' grace may delay it)."""
    deadline = time.monotonic() + 30
    while fake.list(*JOBSETS, NS) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert fake.list(*JOBSETS, NS) == []
