"""The Kubernetes actuator against an HTTP-level fake of the Kubernetes API.

No API server can run here, so a small HTTP server on 127.0.0.1 plays one: it
keeps nodes, a Deployment's scale, an HPA, a Volcano Queue, a Kueue
ClusterQueue and gang pods in memory, answers the official ``kubernetes``
client's requests, and records them. It checks the requests (paths, verbs,
content types, bodies), not Kubernetes' behaviour; a PodDisruptionBudget is
played by answering 429 to the first evictions.
"""

from __future__ import annotations

import copy
import http.server
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fake_kube import JsonHandler, kube_client
from tideflow.broker import Action, Decision, Reclaim
from tideflow.broker.kubernetes import ClusterTarget, KubernetesActuator
from tideflow.checkpoint import CheckpointManager


class FakeCluster:
    def __init__(self) -> None:
        self.nodes = {
            f"gpu-{i}": {
                "metadata": {"name": f"gpu-{i}", "labels": {"nvidia.com/gpu.present": "true"}},
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
                "status": {"allocatable": {"nvidia.com/gpu": "8"}},
            }
            for i in range(4)
        }
        self.nodes["gpu-0"]["metadata"]["labels"]["tideflow.io/pool"] = "inference"
        self.replicas: int | None = None
        self.hpa: dict[str, Any] = {}
        self.volcano: dict[str, Any] = {}
        self.kueue = {
            "metadata": {"name": "training"},
            "spec": {
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": "h100",
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "512"},
                                    {"name": "nvidia.com/gpu", "nominalQuota": "16"},
                                ],
                            }
                        ],
                    }
                ]
            },
        }
        self.pods = {"job-a-worker-0": "job-a", "job-a-worker-1": "job-a", "job-b-0": "job-b"}
        self.placement = {"job-a-worker-0": "gpu-1", "job-a-worker-1": "gpu-2", "job-b-0": "gpu-3"}
        self.pdb_refusals = 1  # the first eviction is refused, as a PDB would
        self.requests: list[tuple[str, str, str, Any]] = []
        self.stores: dict[str, str] = {}  # gang -> the checkpoint store its pods are given

    def pod(self, name: str) -> dict[str, Any]:
        gang = self.pods[name]
        gpus = "8" if gang == "job-a" else "4"
        store = self.stores.get(gang)
        env = [{"name": "TIDEFLOW_CHECKPOINT_URI", "value": store}] if store else []
        return {
            "metadata": {"name": name, "namespace": "ml", "labels": {"tideflow.io/gang": gang}},
            "spec": {
                "nodeName": self.placement[name],
                "priority": 0 if gang == "job-a" else 5,
                "containers": [
                    {
                        "name": "worker",
                        "resources": {"requests": {"nvidia.com/gpu": gpus}},
                        "env": env,
                    }
                ],
            },
            "status": {"phase": "Running", "startTime": "2026-11-23T06:00:00Z"},
        }


def handler_for(cluster: FakeCluster) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def _record(self, body: Any) -> str:
            path = self.path.split("?", 1)[0]
            cluster.requests.append(
                (self.command, path, self.headers.get("Content-Type", ""), body)
            )
            return path

        def do_GET(self) -> None:  # noqa: N802 - http.server names
            path = self._record(None)
            if path == "/api/v1/nodes":
                assert "labelSelector=nvidia.com%2Fgpu.present%3Dtrue" in self.path
                return self._send(200, {"kind": "NodeList", "items": list(cluster.nodes.values())})
            if path == "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/training":
                return self._send(200, copy.deepcopy(cluster.kueue))
            if path == "/api/v1/namespaces/ml/pods":
                gang = (
                    self.path.split("tideflow.io%2Fgang%3D", 1)[1] if "%3D" in self.path else None
                )
                items = [
                    cluster.pod(name)
                    for name, owner in cluster.pods.items()
                    if gang is None or owner == gang
                ]
                return self._send(200, {"kind": "PodList", "items": items})
            return self._send(404, {"kind": "Status", "code": 404})

        def do_PATCH(self) -> None:  # noqa: N802 - http.server names
            body = self._body()
            path = self._record(body)
            if match := re.fullmatch(r"/api/v1/nodes/([\w-]+)", path):
                node = cluster.nodes[match.group(1)]
                node["metadata"]["labels"].update(body["metadata"]["labels"])
                node["spec"]["taints"] = body["spec"]["taints"]
                return self._send(200, node)
            if path == "/apis/apps/v1/namespaces/ml/deployments/inference/scale":
                cluster.replicas = body["spec"]["replicas"]
                return self._send(200, {"kind": "Scale", "spec": body["spec"]})
            if path == "/apis/autoscaling/v2/namespaces/ml/horizontalpodautoscalers/inference":
                cluster.hpa = body["spec"]
                spec = {
                    "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x"},
                    **body["spec"],
                }
                return self._send(200, {"kind": "HorizontalPodAutoscaler", "spec": spec})
            if path == "/apis/scheduling.volcano.sh/v1beta1/queues/training":
                cluster.volcano = body["spec"]
                return self._send(200, {"spec": body["spec"]})
            if path == "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/training":
                cluster.kueue["spec"].update(body["spec"])
                return self._send(200, cluster.kueue)
            return self._send(404, {"kind": "Status", "code": 404})

        def do_POST(self) -> None:  # noqa: N802 - http.server names
            body = self._body()
            path = self._record(body)
            if match := re.fullmatch(r"/api/v1/namespaces/ml/pods/([\w-]+)/eviction", path):
                if cluster.pdb_refusals > 0:
                    cluster.pdb_refusals -= 1
                    return self._send(429, {"kind": "Status", "code": 429, "reason": "TooMany"})
                cluster.pods.pop(match.group(1))
                return self._send(201, {"kind": "Status", "status": "Success"})
            return self._send(404, {"kind": "Status", "code": 404})

    return Handler


@pytest.fixture
def cluster() -> Iterator[tuple[FakeCluster, Any]]:
    fake = FakeCluster()
    with kube_client(handler_for(fake)) as client:
        yield fake, client


def grow_to(gpus: int, *victims: str) -> Decision:
    reclaims = tuple(Reclaim(v, 8, True, 0.0) for v in victims)
    return Decision(Action.GROW, gpus, gpus, gpus, reclaims=reclaims, reason="test")


def test_growing_evicts_through_the_eviction_api_then_moves_whole_nodes(
    cluster: tuple[FakeCluster, Any],
) -> None:
    fake, api = cluster
    target = ClusterTarget(namespace="ml", queue_kind="volcano")
    actuator = KubernetesActuator(api, target, grace_s=30, retry_s=0.01)
    applied = actuator.apply(grow_to(16, "job-a"))
    assert applied.inference_gpus == 16 and applied.inference_nodes == ("gpu-0", "gpu-1")
    assert sorted(applied.evicted_pods) == ["job-a-worker-0", "job-a-worker-1"]
    assert fake.pods == {"job-b-0": "job-b"}  # the other gang is untouched
    evictions = [r for r in fake.requests if r[0] == "POST"]
    assert len(evictions) == 3  # one 429 from the PDB, retried, then both pods
    assert evictions[-1][3]["metadata"] == {"name": "job-a-worker-1", "namespace": "ml"}
    node = fake.nodes["gpu-1"]
    assert node["metadata"]["labels"]["tideflow.io/pool"] == "inference"
    assert {"key": "other", "value": "x", "effect": "NoExecute"} in node["spec"]["taints"]
    assert {"key": "tideflow.io/pool", "value": "inference", "effect": "NoSchedule"} in node[
        "spec"
    ]["taints"]
    assert fake.replicas == 16  # one GPU per replica
    assert fake.volcano == {"capability": {"nvidia.com/gpu": "16"}}
    patches = [r for r in fake.requests if r[0] == "PATCH"]
    assert {content for _, _, content, _ in patches} == {"application/merge-patch+json"}
    # Eviction comes before the node is handed to inference.
    order = [(r[0], r[1]) for r in fake.requests]
    last_eviction = max(i for i, r in enumerate(order) if r[0] == "POST")
    first_node_patch = min(i for i, r in enumerate(order) if r[1].startswith("/api/v1/nodes/"))
    assert last_eviction < first_node_patch


def test_moving_a_node_changes_its_pool_label_and_taint_and_nothing_else(
    cluster: tuple[FakeCluster, Any],
) -> None:
    """deploy/kubernetes/broker-rbac.yaml's ValidatingAdmissionPolicy refuses any other
    change; a taint's timeAdded (the start of a NoExecute taint's toleration time) is
    part of the taint, so it is sent back as read."""
    fake, api = cluster
    before = copy.deepcopy(fake.nodes["gpu-1"])
    actuator = KubernetesActuator(api, ClusterTarget(namespace="ml"), grace_s=30, retry_s=0.01)
    actuator.apply(grow_to(16))
    after = fake.nodes["gpu-1"]
    assert after["metadata"]["labels"].pop("tideflow.io/pool") == "inference"
    pool_taints = [t for t in after["spec"]["taints"] if t["key"] == "tideflow.io/pool"]
    assert pool_taints == [
        {"key": "tideflow.io/pool", "value": "inference", "effect": "NoSchedule"}
    ]
    after["spec"]["taints"].remove(pool_taints[0])
    assert after == before


def test_lending_returns_nodes_and_moves_kueue_quota_and_hpa_bounds(
    cluster: tuple[FakeCluster, Any],
) -> None:
    fake, api = cluster
    for name in ("gpu-1", "gpu-2"):
        fake.nodes[name]["metadata"]["labels"]["tideflow.io/pool"] = "inference"
    target = ClusterTarget(namespace="ml", hpa="inference", queue_kind="kueue", gpus_per_replica=2)
    applied = KubernetesActuator(api, target).apply(Decision(Action.LEND, 8, 5, 8, reason="trough"))
    assert applied.inference_nodes == ("gpu-0",)
    assert fake.nodes["gpu-2"]["metadata"]["labels"]["tideflow.io/pool"] == "training"
    assert fake.hpa == {"minReplicas": 4, "maxReplicas": 4}
    quotas = fake.kueue["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    assert quotas == [
        {"name": "cpu", "nominalQuota": "512"},
        {"name": "nvidia.com/gpu", "nominalQuota": "24"},  # was 16: 3 nodes lent to training
    ]
    assert any(r[0] == "PATCH" and r[1].endswith("/clusterqueues/training") for r in fake.requests)


def test_kueue_queue_without_a_gpu_quota_is_a_clear_error(
    cluster: tuple[FakeCluster, Any],
) -> None:
    _, api = cluster
    target = ClusterTarget(namespace="ml", queue_kind="kueue", kueue_flavor="a100")
    with pytest.raises(ValueError, match=r"no nvidia\.com/gpu quota in flavor a100"):
        KubernetesActuator(api, target).apply(grow_to(8))


def test_observing_the_cluster_gives_pools_gangs_and_idle_gpus(
    cluster: tuple[FakeCluster, Any],
    tmp_path: Path,
) -> None:
    from tideflow.broker import GangView

    fake, api = cluster
    fake.pods["inference-0"] = "serving"  # not a gang, on the inference node
    fake.placement["inference-0"] = "gpu-0"
    # job-a committed a checkpoint after its pods started; job-b's store has none yet
    store_a, store_b = (tmp_path / "a").as_uri(), (tmp_path / "b").as_uri()
    committed = CheckpointManager(store_a).save(10, {"model": b"weights"})
    fake.stores = {"job-a": store_a, "job-b": store_b}
    actuator = KubernetesActuator(api, ClusterTarget(namespace="ml"))
    assert actuator.total_gpus() == 32 and actuator.inference_gpus() == 8
    started = 1795413600.0  # 2026-11-23T06:00:00Z
    assert committed.created_at > started
    # the serving pod sits on the inference node: not a training gang
    assert actuator.gangs() == (
        GangView("job-a", 16, 0, committed.created_at),
        GangView("job-b", 4, 5, started),
    )
    assert actuator.idle_training_gpus() == 24 - 16 - 4
