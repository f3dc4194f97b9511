"""The broker's Kubernetes actuator as its ServiceAccount on the real control plane.

Three kwok GPU nodes of their own (4 GPUs each, selected by the broker as
``tideflow.io/broker-test=true``): bk-2 lent to inference, bk-0 and bk-1 running a
training gang of two 4-GPU pods. The inference Deployment and both
PodDisruptionBudgets are applied as the platform would; the PDBs' status is the
disruption controller's (kube-controller-manager), which counts pods only once they
are Ready. The actuator acts through deploy/kubernetes/broker-rbac.yaml (its Role
and the node admission policy) by impersonation of ``tideflow-broker``.

kwok stands in for the kubelet and the containers (its stages make pods Ready and
remove deleted ones); nothing else is faked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.conftest import NAMESPACE, service_account
from tests.cluster.test_gangs import wait_for
from tideflow.broker import Action, BrokerDecision, Reclaim
from tideflow.broker.kubernetes import ClusterTarget, KubernetesActuator
from tideflow.stack.cluster.kubeapi import Kube
from tideflow.stack.cluster.nodes import KWOK_LABEL
from tideflow.stack.cluster.state import ClusterState

GPU = "nvidia.com/gpu"
SELECTOR = ("tideflow.io/broker-test", "true")
POOL = "tideflow.io/pool"
GANG = "bk-gang"
TARGET = ClusterTarget(
    namespace=NAMESPACE,
    node_selector="=".join(SELECTOR),
    queue_kind="kueue",
    training_queue="training",
    kueue_flavor="h100",
)


def node(name: str, pool: str) -> dict[str, Any]:
    capacity = {"cpu": "16", "memory": "64Gi", "pods": "110", GPU: "4"}
    labels = {
        KWOK_LABEL[0]: KWOK_LABEL[1],
        "kubernetes.io/hostname": name,
        SELECTOR[0]: SELECTOR[1],
        POOL: pool,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "spec": {"taints": [{"key": POOL, "value": pool, "effect": "NoSchedule"}]},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


RESTRICTED = {  # the namespace enforces Pod Security's restricted profile
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def placement(pool: str) -> dict[str, Any]:
    """A pool's pods: on its nodes of this test, tolerating its taint."""
    return {
        "nodeSelector": {POOL: pool, SELECTOR[0]: SELECTOR[1]},
        "tolerations": [{"key": POOL, "operator": "Equal", "value": pool, "effect": "NoSchedule"}],
    }


def inference_objects(replicas: int) -> list[dict[str, Any]]:
    labels = {"app": "inference"}
    container = {"name": "serve", "image": "serve:1", "resources": {"limits": {GPU: "1"}}}
    container["securityContext"] = RESTRICTED
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "inference", "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "priorityClassName": "tideflow-inference",
                    "containers": [container],
                    **placement("inference"),
                },
            },
        },
    }
    return [deployment, budget("inference", labels, max_unavailable=1)]


def budget(name: str, labels: dict[str, str], **spec: int) -> dict[str, Any]:
    keys = {"max_unavailable": "maxUnavailable", "min_available": "minAvailable"}
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "selector": {"matchLabels": labels},
            **{keys[key]: value for key, value in spec.items()},
        },
    }


def gang_pod(name: str) -> dict[str, Any]:
    container = {"name": "worker", "image": "train:1", "resources": {"limits": {GPU: "4"}}}
    container["securityContext"] = RESTRICTED
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"tideflow.io/gang": GANG}},
        "spec": {
            "priorityClassName": "tideflow-training",
            "containers": [container],
            **placement("training"),
        },
    }


def pods(kube: Kube, selector: str) -> list[Any]:
    core = client.CoreV1Api(kube.api)
    return list(core.list_namespaced_pod(NAMESPACE, label_selector=selector).items)


def ready(pod: Any) -> bool:
    conditions = pod.status.conditions or []
    alive = pod.metadata.deletion_timestamp is None
    return alive and any(c.type == "Ready" and c.status == "True" for c in conditions)


def serving(kube: Kube) -> dict[str, int]:
    """Ready inference pods per node."""
    found: dict[str, int] = {}
    for pod in pods(kube, "app=inference"):
        if ready(pod):
            found[pod.spec.node_name] = found.get(pod.spec.node_name, 0) + 1
    return found


def allowed(kube: Kube, name: str) -> Callable[[], Any]:
    """The PDB's disruptions allowed, once the disruption controller has computed them."""

    def check() -> Any:
        pdb = client.PolicyV1Api(kube.api).read_namespaced_pod_disruption_budget(name, NAMESPACE)
        status = pdb.status
        if status is None or status.observed_generation != pdb.metadata.generation:
            return None
        return (status.current_healthy, status.disruptions_allowed)

    return check


def training_quota(kube: Kube) -> str:
    queue = client.CustomObjectsApi(kube.api).get_cluster_custom_object(
        "kueue.x-k8s.io", "v1beta2", "clusterqueues", "training"
    )
    (flavor,) = [
        f for g in queue["spec"]["resourceGroups"] for f in g["flavors"] if f["name"] == "h100"
    ]
    (quota,) = [r["nominalQuota"] for r in flavor["resources"] if r["name"] == GPU]
    return str(quota)


def pool_of(kube: Kube, name: str) -> tuple[str, list[tuple[str, str, str]]]:
    found = client.CoreV1Api(kube.api).read_node(name)
    taints = [(t.key, t.value, t.effect) for t in found.spec.taints or []]
    return found.metadata.labels[POOL], taints


@pytest.fixture(scope="module")
def pools(deployed: Any, kube: Kube) -> Kube:
    """bk-2 serving 4 inference replicas, bk-0 and bk-1 running the gang, PDBs computed."""
    kube.create_nodes(
        [node("bk-0", "training"), node("bk-1", "training"), node("bk-2", "inference")]
    )
    kube.apply(inference_objects(4), manager="tideflow-platform")
    kube.apply([budget(GANG, {"tideflow.io/gang": GANG}, min_available=2)], manager="platform")
    core = client.CoreV1Api(kube.api)
    for name in ("bk-gang-0", "bk-gang-1"):
        core.create_namespaced_pod(NAMESPACE, gang_pod(name))
    wait_for("4 replicas serving on bk-2", lambda: serving(kube) == {"bk-2": 4}, timeout_s=60)
    wait_for(
        "the gang Ready on bk-0 and bk-1",
        lambda: sum(map(ready, pods(kube, f"tideflow.io/gang={GANG}"))) == 2,
    )
    assert wait_for("the gang's PDB computed", allowed(kube, GANG)) == (2, 0)
    assert wait_for("inference's PDB computed", allowed(kube, "inference")) == (4, 1)
    return kube


def broker(cluster: ClusterState, grace_s: float) -> KubernetesActuator:
    api = service_account(cluster, "tideflow-broker")
    return KubernetesActuator(api, TARGET, grace_s=grace_s, retry_s=0.5)


def grow_to(gpus: int) -> BrokerDecision:
    return BrokerDecision(
        Action.GROW, gpus, gpus, gpus, reclaims=(Reclaim(GANG, 8, True, 0.0),), reason="test"
    )


def test_growing_inference_waits_for_the_gangs_pdb_then_evicts_it_and_takes_its_node(
    pools: Kube, cluster: ClusterState
) -> None:
    kube = pools
    held = broker(cluster, grace_s=3).apply(grow_to(8))
    # minAvailable 2 of 2: the Eviction API answers 429 until the broker's grace ends
    assert held.evicted_pods == () and sorted(held.refused_by_pdb) == ["bk-gang-0", "bk-gang-1"]
    assert held.inference_gpus == 4 and held.inference_nodes == ("bk-2",)
    assert "PDB kept" in held.note
    assert len(pods(kube, f"tideflow.io/gang={GANG}")) == 2
    # minAvailable, not maxUnavailable: the disruption controller derives a
    # maxUnavailable budget from the pods' controller's scale, which these bare pods
    # lack (with maxUnavailable 2 it never allowed a disruption here)
    kube.apply([budget(GANG, {"tideflow.io/gang": GANG}, min_available=0)], manager="platform")
    wait_for("the gang's PDB allowing 2", lambda: allowed(kube, GANG)() == (2, 2))
    applied = broker(cluster, grace_s=30).apply(grow_to(8))
    assert sorted(applied.evicted_pods) == ["bk-gang-0", "bk-gang-1"]
    assert applied.refused_by_pdb == () and applied.stopped_gpus == 8
    assert applied.inference_gpus == 8 and applied.inference_nodes == ("bk-2", "bk-0")
    assert pool_of(kube, "bk-0") == ("inference", [(POOL, "inference", "NoSchedule")])
    assert pool_of(kube, "bk-1")[0] == "training"
    wait_for("the gang's pods gone", lambda: not pods(kube, f"tideflow.io/gang={GANG}"))
    wait_for(
        "8 replicas serving on bk-2 and bk-0",
        lambda: serving(kube) == {"bk-2": 4, "bk-0": 4},
        timeout_s=60,
    )
    assert training_quota(kube) == "4"  # 12 GPUs, 8 of them inference's


def test_shrinking_inference_gives_its_node_back_with_no_replica_left_on_it(
    pools: Kube, cluster: ClusterState
) -> None:
    """Lending returns bk-2, the highest-named inference node, whose replicas are the
    oldest: the ReplicaSet scales down by deleting its newest pods (on bk-0), so the
    broker must evict the ones left on the node it gave back, through the Eviction API,
    one at a time as inference's PDB (maxUnavailable 1) allows; the ReplicaSet places
    their replacements on the inference pool."""
    kube = pools
    lend = BrokerDecision(Action.LEND, 4, 4, 4, reason="trough")
    applied = broker(cluster, grace_s=60).apply(lend)
    assert applied.inference_gpus == 4 and applied.inference_nodes == ("bk-0",)
    assert pool_of(kube, "bk-2") == ("training", [(POOL, "training", "NoSchedule")])
    assert training_quota(kube) == "8"
    deployment = client.AppsV1Api(kube.api).read_namespaced_deployment("inference", NAMESPACE)
    assert deployment.spec.replicas == 4
    wait_for(
        "4 replicas serving, all on the inference pool",
        lambda: serving(kube) == {"bk-0": 4} and len(pods(kube, "app=inference")) == 4,
        timeout_s=60,
    )
