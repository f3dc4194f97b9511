"""A gang of a cluster file's priority class carries that class to Kueue and Volcano.

``tideflow compile --target kueue|volcano CLUSTER_FILE`` makes a Kueue
WorkloadPriorityClass and a scheduling.k8s.io/v1 PriorityClass of each declared
class (``tideflow.compile.team_queues.priority_class_name``). A gang of a class
names that object: the JobSet by the label ``kueue.x-k8s.io/priority-class`` on its
own metadata, the Volcano Job by ``spec.priorityClassName``. Each test compiles a
small cluster file with the real command line, builds the gang as the operator
does (``resolve_gang`` -> ``ResolvedGang.cluster_job`` -> the Kubernetes backend),
checks the name against the compiled objects, validates the gang object against the
upstream CRD schema (../shared/schemas) and has the Kubernetes fake (tests/kubefake)
admit it with the compiled objects applied. A gang without a class is unchanged
(the golden files of tests/kube/test_kube_jobset.py and tests/kube/test_kube_volcano.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kubefake import DEPLOY, KubeFake, service_account
from tests.kubefake.schemas import SCHEMAS, crd_schema, validate
from tideflow.backends.kubernetes import KubernetesBackend, gang_object
from tideflow.cli import main
from tideflow.compile.gang_plan import gang_plan_from_json
from tideflow.gangs import resolve_gang
from tideflow.gangs.resolved import ResolvedGang
from tideflow.inventory import Inventory, inventory_for
from tideflow.kube import KubeSettings

NS = "tideflow"
WORKER = service_account(NS, "tideflow-airflow-worker")
VOLCANO = KubeSettings(namespace=NS)
KUEUE = KubeSettings(namespace=NS, gang_scheduler="kueue")
LABEL = "kueue.x-k8s.io/priority-class"
ROOT = "s3://tideflow/artifacts"

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
  - {name: normal, value: 100}
teams:
  - name: vision
    quota: [{device: gpu, model: H100, nominal: 8}]
    default_priority_class: normal
  - name: nlp
    quota: [{device: gpu, model: H100, nominal: 8}]
"""
CRDS = {
    "kueue": ("jobset/jobset.x-k8s.io_jobsets.yaml", "v1alpha2"),
    "volcano": ("volcano/batch.volcano.sh_jobs.yaml", "v1alpha1"),
}
WANTED = {"kueue": "WorkloadPriorityClass", "volcano": "PriorityClass"}


@pytest.fixture
def cluster_file(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER)
    return path


def compiled(cluster_file: Path, engine: str) -> list[dict[str, Any]]:
    """What `tideflow compile --target ENGINE CLUSTER_FILE` writes, as objects."""
    target = cluster_file.with_name(f"{engine}.yaml")
    assert main(["compile", "--target", engine, str(cluster_file), "-o", str(target)]) == 0
    return [d for d in yaml.safe_load_all(target.read_text()) if d]


def class_names(objects: list[dict[str, Any]], engine: str) -> set[str]:
    return {o["metadata"]["name"] for o in objects if o["kind"] == WANTED[engine]}


def gang(
    priority_class: str | None = "urgent", step: str = "train", classes: Inventory | None = None
) -> ResolvedGang:
    """The vision team's gang step as the operator resolves it, its run naming a class;
    with the cluster file's ``classes``, the class's priority."""
    plan = gang_plan_from_json(
        {
            "workers": 2,
            "devices_per_worker": 1,
            "entrypoint": ["python", "-m", "vision.train"],
            "device": {"class": "gpu", "model": "H100"},
            "max_restarts": 1,
            "priority_class": priority_class,
        }
    )
    return resolve_gang(
        plan,
        pipeline="vision-train",
        team="vision",
        run_id="manual__2026-11-23T12:00:00+00:00",
        step=step,
        artifact_root=ROOT,
        allowed_roots=(ROOT,),
        classes=classes,
    )


def named_class(obj: dict[str, Any], engine: str) -> str | None:
    """The class a gang object names: the JobSet's label, the Volcano Job's field."""
    if engine == "kueue":
        return obj["metadata"]["labels"].get(LABEL)
    return obj["spec"]["priorityClassName"]


@pytest.fixture
def fake() -> Iterator[KubeFake]:
    with KubeFake() as cluster:
        cluster.apply(DEPLOY / "priority-classes.yaml")  # the pods' own classes
        yield cluster


@pytest.mark.skipif(not SCHEMAS.is_dir(), reason=f"no CRD schemas at {SCHEMAS}")
@pytest.mark.parametrize("engine", ["kueue", "volcano"])
def test_a_gang_of_a_class_names_the_object_tideflow_compile_emits(
    cluster_file: Path, engine: str
) -> None:
    """Kueue reads the label from the JobSet's own labels (kueue pkg/controller/
    jobframework/utils.go WorkloadPriorityClassName; the key is pkg/controller/constants/
    constants.go WorkloadPriorityClassLabel; site/content/en/docs/concepts/
    workload_priority_class.md). Volcano gives its pods the Job's priorityClassName
    where their template has none (volcano pkg/controllers/job/job_controller_util.go
    createJobPod)."""
    settings = KUEUE if engine == "kueue" else VOLCANO
    names = class_names(compiled(cluster_file, engine), engine)
    assert names == {"urgent", "normal"}
    obj = gang_object(gang("urgent").cluster_job(), settings)
    assert named_class(obj, engine) == "urgent"
    assert validate(obj, crd_schema(*CRDS[engine])) == []
    if engine == "kueue":
        # the label is the JobSet's, not its pods' (they keep their PriorityClass)
        (replicated,) = obj["spec"]["replicatedJobs"]
        template = replicated["template"]["spec"]["template"]
        assert LABEL not in template["metadata"]["labels"]
        assert template["spec"]["priorityClassName"] == "tideflow-training"
    else:
        # the pods take the Job's class (createJobPod): their template names none
        assert "priorityClassName" not in obj["spec"]["tasks"][0]["template"]["spec"]
    # the team's default class (resolved as on the local backend) is carried too
    default = gang(None, classes=inventory_for(cluster_file))
    assert default.priority_class == "normal" and default.priority == 100
    assert named_class(gang_object(default.cluster_job(), settings), engine) in names


def test_kueue_admits_the_jobset_that_names_its_workload_priority_class(
    cluster_file: Path, fake: KubeFake
) -> None:
    """The JobSet passes the CRD schema (with CEL), the JobSet webhook and Kueue's JobSet
    webhook in the fake, and its label names a WorkloadPriorityClass that exists: Kueue
    does not fall back to the pods' PriorityClass when the label names a missing class
    (kueue site/content/en/docs/concepts/workload_priority_class.md, "Referencing a
    WorkloadPriorityClass")."""
    objects = compiled(cluster_file, "kueue")
    fake.apply(*objects)
    backend = KubernetesBackend(fake.client(WORKER), KUEUE)
    job = gang("urgent").cluster_job()
    backend.submit(job)
    name = backend.job_name(job.gang_id)
    created = fake.jobset.jobset(NS, name)
    assert created["spec"]["suspend"] is True  # Kueue's webhook took it
    labels = created["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "vision"
    wpc = fake.get("kueue.x-k8s.io/v1beta2", "WorkloadPriorityClass", labels[LABEL], "")
    assert wpc is not None and wpc["value"] == 1000
    assert fake.kueue.admit(NS, name) == {"nvidia.com/gpu": "h100"}
    fake.jobset.pods_running(NS, name)
    pod = fake.jobset.pod(NS, name)
    assert pod["spec"]["priorityClassName"] == "tideflow-training"  # the pods' own
    # a gang without a class carries no label: its pods' PriorityClass is its priority
    plain = gang(None, "evaluate").cluster_job()
    backend.submit(plain)
    plain_jobset = fake.jobset.jobset(NS, backend.job_name(plain.gang_id))
    assert LABEL not in plain_jobset["metadata"]["labels"]


def test_volcano_pods_get_the_compiled_priority_class_of_their_gang(
    cluster_file: Path, fake: KubeFake
) -> None:
    """The Job passes the CRD schema and Volcano's Job webhooks in the fake; Volcano's job
    controller gives each pod the Job's priorityClassName (volcano pkg/controllers/job/
    job_controller_util.go createJobPod), and the Priority admission plugin resolves it
    to the compiled PriorityClass's value (a name no PriorityClass has is refused)."""
    fake.apply(*compiled(cluster_file, "volcano"))  # the PriorityClasses and team Queues
    backend = KubernetesBackend(fake.client(WORKER), VOLCANO)
    job = gang("urgent").cluster_job()
    backend.submit(job)
    name = backend.job_name(job.gang_id)
    assert fake.volcano.job(NS, name)["spec"]["priorityClassName"] == "urgent"
    fake.volcano.pods_running(NS, name)
    for index in range(2):
        pod = fake.volcano.pod(NS, name, index=index)
        assert pod["spec"]["priorityClassName"] == "urgent"
        assert pod["spec"]["priority"] == 1000  # the compiled class's value
    # without a class, as before: the step's priority mapped (KubeSettings.priority_class)
    plain = gang(None, "evaluate").cluster_job()
    backend.submit(plain)
    plain_job = fake.volcano.job(NS, backend.job_name(plain.gang_id))
    assert plain_job["spec"]["priorityClassName"] == "tideflow-training"
