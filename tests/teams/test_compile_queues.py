"""`tideflow compile --target kueue|volcano`: a cluster file's teams as the engines' queues.

Two cluster files: the bank (three teams, one GPU model, borrowing rules with a ratio,
a priority floor, a grace) and the lab (per-model GPU quotas, a class-wide GPU quota,
NPUs, CPU with memory, an auto-return timeout). Their objects validate against the
upstream CRD schemas (../shared/schemas) and are created through the Kubernetes fake,
whose admission runs the CRD schemas and CEL rules, Kueue's ClusterQueue and Cohort
webhooks (tests/kubefake/kueue_webhooks.py, from kueue pkg/webhooks/
clusterqueue_webhook.go) and Volcano's queue webhook (tests/kubefake/
volcano_queue_webhook.py, from volcano pkg/webhooks/admission/queues/validate/
validate_queue.go). deploy/kubernetes's queue files are the compiled
docs/examples/training-cluster.yaml (regenerate with TIDEFLOW_UPDATE_GOLDEN=1).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kubefake import ApiError, KubeFake
from tests.kubefake.schemas import SCHEMAS, crd_schema, validate
from tideflow.cli import main
from tideflow.compile.kueue_queues import compile_kueue, kueue_objects
from tideflow.compile.team_queues import QueueCompileError
from tideflow.compile.volcano_queues import compile_volcano, volcano_objects
from tideflow.inventory import ClusterSpec
from tideflow.spec.loader import load_model

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
EXAMPLE = "docs/examples/training-cluster.yaml"
GPU, NPU = "nvidia.com/gpu", "huawei.com/Ascend910"

BANK = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: bank}
nodes:
  - {name: gpu, count: 10, cpu: 32, accelerators: {class: gpu, model: H100, count: 10}}
priority_classes:
  - {name: urgent, value: 1000, preempts: true}
  - {name: normal, value: 100}
  - {name: batch, value: 0}
teams:
  - name: risk
    quota: [{device: gpu, nominal: 40}]
    default_priority_class: normal
  - name: marketing
    quota: [{device: gpu, nominal: 30}]
    default_priority_class: normal
  - name: research
    quota: [{device: gpu, nominal: 30}]
    default_priority_class: batch
borrowing:
  - {lender: marketing, borrower: risk, max_borrowable_ratio: 0.8, grace: 10m}
  - {lender: research, borrower: risk, max_borrowable_ratio: 0.5, min_priority_class: normal}
"""

LAB = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: lab}
nodes:
  - {name: h100, count: 2, cpu: 64, memory: 512Gi,
     accelerators: {class: gpu, model: H100, count: 8}}
  - {name: a100, count: 2, cpu: 64, memory: 512Gi,
     accelerators: {class: gpu, model: A100, count: 8}}
  - {name: npu, count: 2, cpu: 64, memory: 256Gi,
     accelerators: {class: npu, model: Ascend910, count: 8},
     labels: {accelerator/huawei-npu: ascend-910}}
  - {name: cpu, count: 2, cpu: 32, memory: 128Gi}
priority_classes:
  - {name: prod, value: 500, preempts: true}
  - {name: dev, value: 10}
teams:
  - name: vision
    quota:
      - {device: gpu, model: H100, nominal: 12, borrowing_limit: 4}
      - {device: gpu, model: A100, nominal: 8, lending_limit: 8}
      - {device: npu, nominal: 10, lending_limit: 6}
      - {device: cpu, nominal: 32, borrowing_limit: 16, lending_limit: 16,
         budget_device_hours: 5000}
    priority_classes: [prod, dev]
    default_priority_class: dev
  - name: speech
    quota:
      - {device: gpu, nominal: 8}
      - {device: npu, nominal: 6}
      - {device: cpu, nominal: 32}
borrowing:
  - {lender: vision, borrower: speech, max_borrowable_ratio: 0.5, auto_return_timeout: 2h}
scheduling: {reserve_after: null, fair_sharing: false}
"""


def cluster(text: str, tmp_path: Path, name: str = "cluster.yaml") -> ClusterSpec:
    path = tmp_path / name
    path.write_text(text)
    return load_model(path, ClusterSpec)


def by(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def quotas(queue: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """(flavor, resource) -> the quota entry, less its name."""
    return {
        (f["name"], r["name"]): {k: v for k, v in r.items() if k != "name"}
        for group in queue["spec"].get("resourceGroups", [])
        for f in group["flavors"]
        for r in f["resources"]
    }


# -- the mapping, field by field ----------------------------------------------------------


def test_bank_kueue_quotas_fold_the_borrowing_rules_into_limits(tmp_path: Path) -> None:
    objects, _ = kueue_objects(cluster(BANK, tmp_path))
    assert {
        (o["metadata"]["name"], o["value"]) for o in objects if o["kind"] == "WorkloadPriorityClass"
    } == {
        ("urgent", 1000),
        ("normal", 100),
        ("batch", 0),
    }
    assert by(objects, "ResourceFlavor", "h100")["spec"]["nodeLabels"] == {
        # no labels declared: the product name GPU feature discovery gives an H100, which
        # the gang's pods select too (tests/cluster/test_gangs.py runs one on real Kueue)
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"
    }
    # risk borrows at most 0.8 * 30 from marketing plus 0.5 * 30 from research; it lends
    # to no team. marketing and research lend what their rules let risk take.
    risk, marketing, research = (
        by(objects, "ClusterQueue", t) for t in ("risk", "marketing", "research")
    )
    assert quotas(risk)[("h100", GPU)] == {
        "nominalQuota": 40,
        "borrowingLimit": 39,
        "lendingLimit": 0,
    }
    assert quotas(marketing)[("h100", GPU)] == {
        "nominalQuota": 30,
        "borrowingLimit": 0,
        "lendingLimit": 24,
    }
    assert quotas(research)[("h100", GPU)] == {
        "nominalQuota": 30,
        "borrowingLimit": 0,
        "lendingLimit": 15,
    }
    # every ClusterQueue in the cluster's cohort; the CPU nobody owns is the Cohort's
    assert {q["spec"]["cohortName"] for q in objects if q["kind"] == "ClusterQueue"} == {"bank"}
    assert quotas(by(objects, "Cohort", "bank")) == {("cpu", "cpu"): {"nominalQuota": 320}}
    # urgent preempts: within the team and lower-priority borrowers; reclaim regardless
    assert risk["spec"]["preemption"] == {
        "reclaimWithinCohort": "Any",
        "borrowWithinCohort": {"policy": "LowerPriority"},
        "withinClusterQueue": "LowerPriority",
    }
    local = [o for o in objects if o["kind"] == "LocalQueue"]
    assert {
        (q["metadata"]["namespace"], q["metadata"]["name"], q["spec"]["clusterQueue"])
        for q in local
    } == {("tideflow", t, t) for t in ("risk", "marketing", "research")}
    assert "training" not in {o["metadata"]["name"] for o in objects}  # no broker pool


def test_bank_volcano_queues_hold_deserved_capability_guarantee(tmp_path: Path) -> None:
    objects, _ = volcano_objects(cluster(BANK, tmp_path))
    spec = {q["metadata"]["name"]: q["spec"] for q in objects if q["kind"] == "Queue"}
    assert spec == {
        "risk": {
            "reclaimable": True,
            "deserved": {GPU: "40"},
            "capability": {GPU: "79"},  # 40 + 24 + 15
            "guarantee": {"resource": {GPU: "40"}},  # it lends to no team
        },
        "marketing": {
            "reclaimable": True,
            "deserved": {GPU: "30"},
            "capability": {GPU: "30"},
            "guarantee": {"resource": {GPU: "6"}},  # 30 less the 24 risk may borrow
        },
        "research": {
            "reclaimable": True,
            "deserved": {GPU: "30"},
            "capability": {GPU: "30"},
            "guarantee": {"resource": {GPU: "15"}},
        },
    }
    classes = {o["metadata"]["name"]: o for o in objects if o["kind"] == "PriorityClass"}
    assert {n: (c["value"], c["preemptionPolicy"]) for n, c in classes.items()} == {
        "urgent": (1000, "PreemptLowerPriority"),
        "normal": (100, "Never"),
        "batch": (0, "Never"),
    }


def test_lab_kueue_keeps_quotas_per_model_and_memory_with_cpu(tmp_path: Path) -> None:
    objects, warnings = kueue_objects(cluster(LAB, tmp_path))
    flavors = [o["metadata"]["name"] for o in objects if o["kind"] == "ResourceFlavor"]
    assert flavors == ["cpu", "a100", "ascend910", "h100"]
    assert by(objects, "ResourceFlavor", "ascend910")["spec"]["nodeLabels"] == {
        "accelerator/huawei-npu": "ascend-910"
    }
    vision, speech = by(objects, "ClusterQueue", "vision"), by(objects, "ClusterQueue", "speech")
    assert quotas(vision) == {
        ("h100", GPU): {"nominalQuota": 12, "borrowingLimit": 0, "lendingLimit": 6},
        ("a100", GPU): {"nominalQuota": 8, "borrowingLimit": 4, "lendingLimit": 4},
        ("ascend910", NPU): {"nominalQuota": 10, "borrowingLimit": 0, "lendingLimit": 5},
        ("cpu", "cpu"): {"nominalQuota": 32, "borrowingLimit": 0, "lendingLimit": 16},
        # the CPU-only nodes hold 4Gi a core: memory follows the cpu quota
        ("cpu", "memory"): {"nominalQuota": "128Gi", "borrowingLimit": 0, "lendingLimit": "64Gi"},
    }
    # speech's class-wide 8 GPUs, split 4 + 4 by the models' device counts
    assert quotas(speech) == {
        ("h100", GPU): {"nominalQuota": 4, "borrowingLimit": 6, "lendingLimit": 0},
        ("a100", GPU): {"nominalQuota": 4, "borrowingLimit": 8, "lendingLimit": 0},
        ("ascend910", NPU): {"nominalQuota": 6, "borrowingLimit": 5, "lendingLimit": 0},
        ("cpu", "cpu"): {"nominalQuota": 32, "borrowingLimit": 16, "lendingLimit": 0},
        ("cpu", "memory"): {"nominalQuota": "128Gi", "borrowingLimit": "64Gi", "lendingLimit": 0},
    }
    groups = [g["coveredResources"] for g in vision["spec"]["resourceGroups"]]
    assert groups == [[GPU], [NPU], ["cpu", "memory"]]
    assert vision["spec"]["queueingStrategy"] == "BestEffortFIFO"  # reserve_after: null
    assert "fairSharing" not in vision["spec"]
    assert any("class-wide gpu quota of 8 is split" in w and "speech" in w for w in warnings)


def test_lab_volcano_sums_models_into_resource_names(tmp_path: Path) -> None:
    objects, warnings = volcano_objects(cluster(LAB, tmp_path))
    spec = {q["metadata"]["name"]: q["spec"] for q in objects if q["kind"] == "Queue"}
    assert spec["vision"] == {
        "reclaimable": True,
        "deserved": {"cpu": "32", GPU: "20", NPU: "10"},
        "capability": {"cpu": "32", GPU: "24", NPU: "10"},
        "guarantee": {"resource": {"cpu": "16", GPU: "10", NPU: "5"}},
    }
    assert spec["speech"] == {
        "reclaimable": True,
        "deserved": {"cpu": "32", GPU: "8", NPU: "6"},
        "capability": {"cpu": "48", GPU: "22", NPU: "11"},
        "guarantee": {"resource": {"cpu": "32", GPU: "8", NPU: "6"}},
    }
    assert all("parent" not in s for s in spec.values())  # no broker pool: under root
    assert any("summed into nvidia.com/gpu" in w for w in warnings)


def test_the_broker_pool_compiles_to_the_training_queue_it_moves() -> None:
    """docs/examples/training-cluster.yaml: the H100 nodes carry tideflow.io/pool: training.
    Kueue: ClusterQueue training lends them (the broker sets its h100 nominalQuota), the
    teams own none and weigh their share; Volcano: the parent queue training holds the
    teams' deserved summed and the capability the broker moves."""
    spec = load_model(REPO / EXAMPLE, ClusterSpec)
    kueue, _ = kueue_objects(spec)
    training = by(kueue, "ClusterQueue", "training")
    assert "namespaceSelector" not in training["spec"]  # admits nothing: it only lends
    assert quotas(training) == {("h100", GPU): {"nominalQuota": 120}}
    vision = by(kueue, "ClusterQueue", "vision")
    assert quotas(vision)[("h100", GPU)] == {"nominalQuota": 0}
    assert vision["spec"]["fairSharing"] == {"weight": 64}
    assert by(kueue, "ResourceFlavor", "h100")["spec"]["tolerations"] == [
        {"key": "tideflow.io/pool", "operator": "Exists", "effect": "NoSchedule"}
    ]
    volcano, _ = volcano_objects(spec)
    queues = {q["metadata"]["name"]: q["spec"] for q in volcano if q["kind"] == "Queue"}
    assert [q["metadata"]["name"] for q in volcano] == ["training", "vision", "nlp"]  # parent first
    assert queues["training"]["deserved"] == queues["training"]["capability"] == {GPU: "120"}
    assert {queues[t]["parent"] for t in ("vision", "nlp")} == {"training"}
    assert "capability" not in queues["vision"]  # the broker's capability is never refused


# -- upstream schemas and admission -------------------------------------------------------

CRDS = {
    ("kueue.x-k8s.io/v1beta2", kind): (f"kueue/kueue.x-k8s.io_{plural}.yaml", "v1beta2")
    for kind, plural in (
        ("ClusterQueue", "clusterqueues"),
        ("LocalQueue", "localqueues"),
        ("ResourceFlavor", "resourceflavors"),
        ("Cohort", "cohorts"),
        ("WorkloadPriorityClass", "workloadpriorityclasses"),
    )
} | {
    ("scheduling.volcano.sh/v1beta1", "Queue"): (
        "volcano/scheduling.volcano.sh_queues.yaml",
        "v1beta1",
    )
}


@pytest.mark.skipif(not SCHEMAS.is_dir(), reason=f"no CRD schemas at {SCHEMAS}")
@pytest.mark.parametrize("text", [BANK, LAB, None], ids=["bank", "lab", "deploy"])
@pytest.mark.parametrize("engine", ["kueue", "volcano"])
def test_compiled_objects_pass_upstream_schemas_and_admission(
    tmp_path: Path, text: str | None, engine: str
) -> None:
    spec = load_model(REPO / EXAMPLE, ClusterSpec) if text is None else cluster(text, tmp_path)
    objects, _ = (kueue_objects if engine == "kueue" else volcano_objects)(spec)
    for obj in objects:
        key = (obj["apiVersion"], obj["kind"])
        if key in CRDS:
            assert validate(obj, crd_schema(*CRDS[key])) == [], obj["metadata"]["name"]
    with KubeFake() as fake:  # CRD schema + CEL, Kueue's and Volcano's webhooks, core schemas
        created = fake.apply(*objects)
    assert len(created) == len(objects)


def test_the_fake_refuses_what_kueues_clusterqueue_webhook_refuses(tmp_path: Path) -> None:
    """kueue clusterqueue_webhook.go validateLendingLimit and validateLimit: the rules the
    compiler keeps (lendingLimit <= nominalQuota; limits only in a cohort)."""
    objects, _ = kueue_objects(cluster(BANK, tmp_path))
    risk = by(objects, "ClusterQueue", "risk")
    over = yaml.safe_load(yaml.safe_dump(risk))
    over["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["lendingLimit"] = 41
    alone = yaml.safe_load(yaml.safe_dump(risk))
    del alone["spec"]["cohortName"]
    alone["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0].pop("borrowingLimit")
    with KubeFake() as fake:
        with pytest.raises(ApiError) as refused:
            fake.create(over)
        assert refused.value.code == 403
        assert "lendingLimit" in str(
            refused.value
        ) and "must be less than or equal to the nominalQuota" in str(refused.value)
        with pytest.raises(ApiError) as refused:
            fake.create(alone)
        assert "lendingLimit" in str(refused.value) and "must be nil when cohort is empty" in str(
            refused.value
        )


# -- what the engines cannot express ------------------------------------------------------


def test_warnings_name_each_rule_kueue_cannot_express(tmp_path: Path) -> None:
    _, bank = kueue_objects(cluster(BANK, tmp_path))
    text = "\n".join(bank)
    for rule in (
        "max_borrowable_ratio",
        "min_priority_class (research->risk: normal)",
        "grace per borrowing rule (300s, 600s)",
        "preempts per priority class (teams risk, marketing, research)",
        "priority classes per team",
        "reserve_after (1800s)",
        "fair_sharing",
        "memory: the nodes declare none",
    ):
        assert rule in text, rule
    assert all("tideflow" in w or "Kueue" in w for w in bank)
    _, lab = kueue_objects(cluster(LAB, tmp_path, "lab.yaml"))
    text = "\n".join(lab)
    assert "auto_return_timeout (vision->speech: 7200s)" in text
    assert "budget_device_hours (vision cpu 5000)" in text
    assert "reserve_after" not in text and "fair_sharing" not in text  # both off


def test_warnings_name_each_rule_volcano_cannot_express(tmp_path: Path) -> None:
    _, bank = volcano_objects(cluster(BANK, tmp_path))
    text = "\n".join(bank)
    for rule in (
        "max_borrowable_ratio",
        "min_priority_class",
        "grace per borrowing rule",
        "preempts",
        "priority classes per team",
        "reserve_after (1800s)",
    ):
        assert rule in text, rule
    _, lab = volcano_objects(cluster(LAB, tmp_path, "lab.yaml"))
    text = "\n".join(lab)
    for rule in (
        "auto_return_timeout",
        "fair_sharing: false",
        "summed into nvidia.com/gpu",
    ):
        assert rule in text, rule


@pytest.mark.parametrize("engine", ["kueue", "volcano"])
def test_the_grace_warning_says_the_broker_reclaims_with_the_rules_grace(
    engine: str, tmp_path: Path
) -> None:
    """Where team inference lends (the broker is its tenant), the engine's one grace is
    not the whole story: the broker's own reclaims wait each rule's grace."""
    compile_objects = kueue_objects if engine == "kueue" else volcano_objects
    lab = Path(__file__).parents[2] / "deploy" / "local" / "lab-cluster.yaml"
    _, lent = compile_objects(load_model(lab, ClusterSpec))
    (grace,) = [w for w in lent if "grace per borrowing rule" in w]
    assert "as team inference's tenant" in grace and "rule's grace" in grace
    _, bank = compile_objects(cluster(BANK, tmp_path))
    (grace,) = [w for w in bank if "grace per borrowing rule" in w]
    assert "inference" not in grace


def test_a_cluster_without_teams_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No teams, no quotas: refused, rather than a queue that would invent a team."""
    path = tmp_path / "bare.yaml"
    path.write_text(BANK.split("priority_classes:", maxsplit=1)[0])
    with pytest.raises(QueueCompileError, match="declares no teams"):
        kueue_objects(load_model(path, ClusterSpec))
    assert main(["compile", "--target", "volcano", str(path)]) == 2
    assert "declares no teams" in capsys.readouterr().err


# -- the command line and the committed files ---------------------------------------------


def test_cli_prints_yaml_with_the_warnings_on_top_and_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bank.yaml"
    path.write_text(BANK)
    assert main(["compile", "--target", "kueue", str(path)]) == 0
    out, err = capsys.readouterr()
    header = out.split("\n---\n")[0]
    assert "min_priority_class" in header and all(
        line.startswith("#") for line in header.splitlines()
    )
    assert "warning: kueue: min_priority_class" in err
    kinds = [d["kind"] for d in yaml.safe_load_all(out) if d]
    assert kinds.count("ClusterQueue") == 3 and "Cohort" in kinds
    target = tmp_path / "out.yaml"
    assert main(["compile", "--target", "volcano", str(path), "-o", str(target)]) == 0
    assert [d["kind"] for d in yaml.safe_load_all(target.read_text())].count("Queue") == 3


@pytest.mark.parametrize("engine", ["kueue", "volcano"])
def test_deploy_queue_files_are_the_compiled_example(engine: str) -> None:
    spec = load_model(REPO / EXAMPLE, ClusterSpec)
    compiled, _ = (
        compile_kueue(spec, source=EXAMPLE)
        if engine == "kueue"
        else compile_volcano(spec, source=EXAMPLE)
    )
    golden = DEPLOY / f"{engine}-queues.yaml"
    if os.environ.get("TIDEFLOW_UPDATE_GOLDEN") == "1":
        golden.write_text(compiled)
    assert golden.read_text() == compiled, "regenerate with TIDEFLOW_UPDATE_GOLDEN=1 and review"
