"""The Kubernetes actuator against the one Kubernetes fake (tests/kubefake).

No API server can run here, so the fake plays one over HTTP for the official
``kubernetes`` client: the broker calls it as its own ServiceAccount, so every
call must be granted by deploy/kubernetes/broker-rbac.yaml, every node patch must
pass the ValidatingAdmissionPolicy there, and every patched object must still
validate (Volcano's queue webhook, the Kueue CRD schema, the core schemas).
Evictions go through the fake's eviction subresource, where a
PodDisruptionBudget refuses the first one until the disruption controller
(played by the broker's wait) allows more.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kubefake import DEPLOY, KubeFake, service_account
from tests.kubefake.fake import documents
from tideflow.broker import Action, Decision, Reclaim
from tideflow.broker.kubernetes import ClusterTarget, KubernetesActuator
from tideflow.checkpoint import CheckpointManager

NS = "tideflow"
BROKER = service_account(NS, "tideflow-broker")
STARTED = "2026-11-23T06:00:00Z"
PRIORITY = {"job-a": "tideflow-training", "job-b": "tideflow-training-high"}


def gpu_node(name: str, pool: str | None) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.present": "true"}
    if pool:
        labels["tideflow.io/pool"] = pool
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "taints": [
                {"key": "other", "value": "x", "effect": "NoExecute"},
                {
                    "key": "node.kubernetes.io/unreachable",
                    "effect": "NoExecute",
                    "timeAdded": "2026-11-23T05:00:00Z",
                },
            ]
        },
    }


def gang_pod(name: str, gang: str, gpus: int, store: str | None = None) -> dict[str, Any]:
    env = [{"name": "TIDEFLOW_CHECKPOINT_URI", "value": store}] if store else []
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"tideflow.io/gang": gang}},
        "spec": {
            "priorityClassName": PRIORITY.get(gang, "tideflow-inference"),
            "containers": [
                {
                    "name": "worker",
                    "image": "registry.example.com/train:1",
                    "resources": {
                        "requests": {"nvidia.com/gpu": str(gpus)},
                        "limits": {"nvidia.com/gpu": str(gpus)},
                    },
                    "env": env,
                }
            ],
        },
    }


class Cluster:
    """Four 8-GPU nodes (gpu-0 lent to inference), two training gangs, the inference
    Deployment and HPA, the training queues of deploy/."""

    def __init__(self, fake: KubeFake) -> None:
        self.fake = fake
        fake.apply(DEPLOY / "priority-classes.yaml", DEPLOY / "broker-rbac.yaml")
        # the broker moves the parent queue; its team children are not this test's concern
        (training,) = [
            d for d in documents(DEPLOY / "volcano-queues.yaml") if not d["spec"].get("parent")
        ]
        fake.apply(training, DEPLOY / "kueue-queues.yaml")
        for index in range(4):
            node = fake.create(gpu_node(f"gpu-{index}", "inference" if index == 0 else None))
            fake.set_status(node, {"allocatable": {"nvidia.com/gpu": "8"}})
        labels = {"app": "inference"}
        fake.create(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "inference", "namespace": NS},
                "spec": {
                    "replicas": 8,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {"containers": [{"name": "serve", "image": "serve:1"}]},
                    },
                },
            }
        )
        fake.create(
            {
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": {"name": "inference", "namespace": NS},
                "spec": {
                    "scaleTargetRef": {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": "inference",
                    },
                    "minReplicas": 1,
                    "maxReplicas": 8,
                },
            }
        )
        fake.create(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "job-a", "namespace": NS},
                "spec": {
                    "maxUnavailable": 2,
                    "selector": {"matchLabels": {"tideflow.io/gang": "job-a"}},
                },
            }
        )
        self.allow_disruptions(0)  # the first eviction is refused, as a PDB would

    def allow_disruptions(self, allowed: int) -> None:
        budget = self.fake.get("policy/v1", "PodDisruptionBudget", "job-a")
        self.fake.set_status(
            budget,
            {
                "disruptionsAllowed": allowed,
                "currentHealthy": 2,
                "desiredHealthy": 2,
                "expectedPods": 2,
            },
        )

    def start_gangs(self, stores: dict[str, str] | None = None) -> None:
        stores = stores or {}
        for name, gang, gpus, node in (
            ("job-a-worker-0", "job-a", 8, "gpu-1"),
            ("job-a-worker-1", "job-a", 8, "gpu-2"),
            ("job-b-0", "job-b", 4, "gpu-3"),
        ):
            self.fake.create(gang_pod(name, gang, gpus, stores.get(gang)))
            self.fake.pods.run(NS, name, node=node, started=STARTED)

    def node(self, name: str) -> dict[str, Any]:
        return dict(self.fake.get("v1", "Node", name))

    def broker_requests(self, verb: str | None = None) -> list[Any]:
        return [r for r in self.fake.requests_by(BROKER) if verb in (None, r.verb)]


@pytest.fixture
def cluster() -> Iterator[tuple[Cluster, Any]]:
    with KubeFake() as fake:
        yield Cluster(fake), fake.client(BROKER)


def grow_to(gpus: int, *victims: str) -> Decision:
    reclaims = tuple(Reclaim(v, 8, True, 0.0) for v in victims)
    return Decision(Action.GROW, gpus, gpus, gpus, reclaims=reclaims, reason="test")


def test_growing_evicts_through_the_eviction_api_then_moves_whole_nodes(
    cluster: tuple[Cluster, Any],
) -> None:
    fake, api = cluster
    fake.start_gangs()
    target = ClusterTarget(namespace=NS, queue_kind="volcano")
    # while the broker waits, the disruption controller sees the gang can lose two pods
    actuator = KubernetesActuator(
        api, target, grace_s=30, retry_s=0.01, sleep=lambda _s: fake.allow_disruptions(2)
    )
    applied = actuator.apply(grow_to(16, "job-a"))
    assert applied.inference_gpus == 16 and applied.inference_nodes == ("gpu-0", "gpu-1")
    assert sorted(applied.evicted_pods) == ["job-a-worker-0", "job-a-worker-1"]
    fake.fake.pods.finish_terminating(NS)
    remaining = [p["metadata"]["name"] for p in fake.fake.list("v1", "Pod", NS)]
    assert remaining == ["job-b-0"]  # the other gang is untouched
    evictions = fake.broker_requests("create")
    assert [(r.resource, r.code) for r in evictions] == [
        ("pods/eviction", c) for c in (429, 201, 201)
    ]
    assert evictions[-1].body["metadata"] == {"name": "job-a-worker-1", "namespace": NS}
    node = fake.node("gpu-1")
    assert node["metadata"]["labels"]["tideflow.io/pool"] == "inference"
    assert {"key": "other", "value": "x", "effect": "NoExecute"} in node["spec"]["taints"]
    assert {"key": "tideflow.io/pool", "value": "inference", "effect": "NoSchedule"} in node[
        "spec"
    ]["taints"]
    assert fake.fake.get("apps/v1", "Deployment", "inference")["spec"]["replicas"] == 16
    queue = fake.fake.get("scheduling.volcano.sh/v1beta1", "Queue", "training")
    assert queue["spec"]["capability"] == {"nvidia.com/gpu": "16"}
    patches = fake.broker_requests("patch")
    assert {r.content_type for r in patches} == {"application/merge-patch+json"}
    assert all(r.code == 200 for r in patches)
    # Eviction comes before the node is handed to inference.
    order = fake.broker_requests()
    last_eviction = max(i for i, r in enumerate(order) if r.resource == "pods/eviction")
    first_node_patch = min(
        i for i, r in enumerate(order) if r.resource == "nodes" and r.verb == "patch"
    )
    assert last_eviction < first_node_patch


def test_moving_a_node_changes_its_pool_label_and_taint_and_nothing_else(
    cluster: tuple[Cluster, Any],
) -> None:
    """deploy/kubernetes/broker-rbac.yaml's ValidatingAdmissionPolicy refuses any other
    change (the fake enforces it on the broker's patches); a taint's timeAdded (the start
    of a NoExecute taint's toleration time) is part of the taint, so it is sent back as read."""
    fake, api = cluster
    before = fake.node("gpu-1")
    actuator = KubernetesActuator(api, ClusterTarget(namespace=NS), grace_s=30, retry_s=0.01)
    actuator.apply(grow_to(16))
    after = fake.node("gpu-1")
    assert after["metadata"]["labels"].pop("tideflow.io/pool") == "inference"
    pool_taints = [t for t in after["spec"]["taints"] if t["key"] == "tideflow.io/pool"]
    assert pool_taints == [
        {"key": "tideflow.io/pool", "value": "inference", "effect": "NoSchedule"}
    ]
    after["spec"]["taints"].remove(pool_taints[0])
    for changed in ("resourceVersion", "generation"):
        before["metadata"].pop(changed)
        after["metadata"].pop(changed)
    assert after == before


def test_lending_returns_nodes_and_moves_kueue_quota_and_hpa_bounds(
    cluster: tuple[Cluster, Any],
) -> None:
    fake, api = cluster
    for name in ("gpu-1", "gpu-2"):
        fake.fake.request(
            "PATCH",
            f"/api/v1/nodes/{name}",
            body={"metadata": {"labels": {"tideflow.io/pool": "inference"}}},
            content_type="application/merge-patch+json",
        )
    target = ClusterTarget(namespace=NS, hpa="inference", queue_kind="kueue", gpus_per_replica=2)
    applied = KubernetesActuator(api, target).apply(Decision(Action.LEND, 8, 5, 8, reason="trough"))
    assert applied.inference_nodes == ("gpu-0",)
    assert fake.node("gpu-2")["metadata"]["labels"]["tideflow.io/pool"] == "training"
    hpa = fake.fake.get("autoscaling/v2", "HorizontalPodAutoscaler", "inference")["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (4, 4)
    queue = fake.fake.get("kueue.x-k8s.io/v1beta2", "ClusterQueue", "training")
    quotas = queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    assert quotas == [
        {"name": "nvidia.com/gpu", "nominalQuota": "24"}  # was 120: 3 nodes lent to training
    ]
    assert any(
        r.verb == "patch" and r.resource == "clusterqueues" and r.code == 200
        for r in fake.broker_requests()
    )


def test_kueue_queue_without_a_gpu_quota_is_a_clear_error(
    cluster: tuple[Cluster, Any],
) -> None:
    _, api = cluster
    target = ClusterTarget(namespace=NS, queue_kind="kueue", kueue_flavor="a100")
    with pytest.raises(ValueError, match=r"no nvidia\.com/gpu quota in flavor a100"):
        KubernetesActuator(api, target).apply(grow_to(8))


def test_observing_the_cluster_gives_pools_gangs_and_idle_gpus(
    cluster: tuple[Cluster, Any],
    tmp_path: Path,
) -> None:
    from tideflow.broker import GangView

    fake, api = cluster
    # job-a committed a checkpoint after its pods started; job-b's store has none yet
    store_a, store_b = (tmp_path / "a").as_uri(), (tmp_path / "b").as_uri()
    committed = CheckpointManager(store_a).save(10, {"model": b"weights"})
    fake.start_gangs({"job-a": store_a, "job-b": store_b})
    # a serving pod on the inference node: not a training gang
    fake.fake.create(gang_pod("inference-0", "serving", 8))
    fake.fake.pods.run(NS, "inference-0", node="gpu-0")
    actuator = KubernetesActuator(api, ClusterTarget(namespace=NS))
    assert actuator.total_gpus() == 32 and actuator.inference_gpus() == 8
    started = 1795413600.0  # 2026-11-23T06:00:00Z
    assert committed.created_at > started
    # the pods' priorities come from their PriorityClasses (deploy/kubernetes)
    assert actuator.gangs() == (
        GangView("job-a", 16, 1000, committed.created_at),
        GangView("job-b", 4, 10000, started),
    )
    assert actuator.idle_training_gpus() == 24 - 16 - 4


def test_the_brokers_role_covers_every_call_it_makes(cluster: tuple[Cluster, Any]) -> None:
    """Every call above is made as the broker and allowed by deploy/'s RBAC; the grants it
    never uses are listed here, so a change to either shows."""
    fake, api = cluster
    fake.start_gangs()
    volcano = ClusterTarget(namespace=NS, queue_kind="volcano")
    KubernetesActuator(
        api, volcano, grace_s=30, retry_s=0.01, sleep=lambda _s: fake.allow_disruptions(2)
    ).apply(grow_to(16, "job-a"))
    kueue = ClusterTarget(namespace=NS, hpa="inference", queue_kind="kueue")
    KubernetesActuator(api, kueue).apply(Decision(Action.LEND, 8, 5, 8, reason="trough"))
    assert all(r.code < 400 or r.code == 429 for r in fake.broker_requests())
    unused = {(g.resource, g.verb, g.name) for g in fake.fake.rbac.unused(BROKER, NS)}
    assert unused == {
        ("pods", "get", ""),
        ("pods", "watch", ""),
        ("nodes", "get", ""),
        ("nodes", "watch", ""),
        ("deployments/scale", "get", "inference"),
        ("horizontalpodautoscalers", "get", "inference"),
        ("queues", "get", "training"),
    }


def test_a_patch_the_policy_refuses_reaches_the_broker_as_an_error(
    cluster: tuple[Cluster, Any],
) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    _, api = cluster
    body = {"metadata": {"labels": {"kubernetes.io/hostname": "evil"}}}
    with pytest.raises(ApiException) as refused:
        client.CoreV1Api(api).patch_node(
            "gpu-1", copy.deepcopy(body), _content_type="application/merge-patch+json"
        )
    assert refused.value.status == 422 and "no label of a node" in refused.value.body
