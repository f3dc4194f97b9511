"""deploy/kubernetes: every manifest validates offline against the Kubernetes API schema
(kubernetes-validate, strict: misspelled fields fail), the broker's pod meets the
"restricted" Pod Security Standard, and its RBAC grants exactly what the Kubernetes
actuator calls (no wildcards, no secrets)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.crd_schema import SCHEMAS, crd_schema, validate

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"


def objects() -> list[dict[str, Any]]:
    found = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        found += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return found


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [o for o in objects() if o["kind"] == kind]


def test_broker_pod_meets_the_restricted_pod_security_standard() -> None:
    (deployment,) = [d for d in by_kind("Deployment") if d["metadata"]["name"] == "tideflow-broker"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("hostNetwork") and not pod.get("hostPID")
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert context.get("privileged") is not True
    assert deployment["spec"]["replicas"] == 1  # one decision-maker


def rules(kind: str) -> list[dict[str, Any]]:
    return [rule for role in by_kind(kind) for rule in role["rules"]]


def test_rbac_is_least_privilege_and_covers_the_actuator() -> None:
    every = rules("Role") + rules("ClusterRole")
    for rule in every:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        assert "secrets" not in rule["resources"]
    granted = {
        (group, resource, verb)
        for rule in every
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    needed = {
        ("", "pods", "list"),
        ("", "pods/eviction", "create"),
        ("apps", "deployments/scale", "patch"),
        ("autoscaling", "horizontalpodautoscalers", "patch"),
        ("", "nodes", "list"),
        ("", "nodes", "patch"),
        ("scheduling.volcano.sh", "queues", "patch"),
        ("kueue.x-k8s.io", "clusterqueues", "get"),
        ("kueue.x-k8s.io", "clusterqueues", "patch"),
    }
    assert needed <= granted, needed - granted
    # Pods, evictions and scaling stay namespaced: never granted cluster-wide.
    cluster_wide = {r for rule in rules("ClusterRole") for r in rule["resources"]}
    assert cluster_wide == {"nodes", "queues", "clusterqueues"}


def test_broker_accepts_no_connections() -> None:
    (policy,) = by_kind("NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["ingress"] == []


CRDS = {
    ("scheduling.volcano.sh/v1beta1", "Queue"): (
        "volcano/scheduling.volcano.sh_queues.yaml",
        "v1beta1",
    )
}


def test_every_core_manifest_validates_strictly_against_the_kubernetes_schema() -> None:
    import kubernetes_validate

    core = [o for o in objects() if (o["apiVersion"], o["kind"]) not in CRDS]
    assert core
    for obj in core:
        kubernetes_validate.validate(obj, "1.33", strict=True)
    broken = by_kind("Deployment")[0]
    broken["spec"]["replica"] = 1  # a misspelled field
    try:
        kubernetes_validate.validate(broken, "1.33", strict=True)
    except kubernetes_validate.ValidationError as exc:
        assert "replica" in str(exc)
    else:
        raise AssertionError("a misspelled field passed strict validation")


@pytest.mark.skipif(not SCHEMAS.is_dir(), reason=f"no CRD schemas at {SCHEMAS}")
def test_volcano_queues_validate_against_the_crd_schema() -> None:
    queues = [o for o in objects() if (o["apiVersion"], o["kind"]) in CRDS]
    assert {q["metadata"]["name"] for q in queues} >= {"training"}
    for queue in queues:
        relative, version = CRDS[(queue["apiVersion"], queue["kind"])]
        assert validate(queue, crd_schema(relative, version)) == [], queue["metadata"]["name"]
    children = [q for q in queues if q["spec"].get("parent") == "training"]
    assert children  # team queues sit under the queue whose capability the broker moves


def test_gang_priority_classes_exist() -> None:
    from tideflow.kube import KubeSettings

    defined = {o["metadata"]["name"] for o in by_kind("PriorityClass")}
    assert {name for _, name in KubeSettings().priority_classes} <= defined
