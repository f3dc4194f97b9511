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

from tests.fakes import WindowedLoad
from tests.kubefake import DEPLOY, KubeFake, service_account
from tests.kubefake.fake import documents
from tests.kubefake.volcano_queue_webhook import validate_queue
from tideflow.broker import Action, BrokerDecision, Reclaim, decide
from tideflow.broker.actuator import Applied
from tideflow.broker.kubernetes import (
    ClusterTarget,
    KubernetesActuator,
    TrainingQueueRefusedError,
)
from tideflow.checkpoint import CheckpointManager
from tideflow.kube import KubeSettings
from tideflow.kube.client import MERGE
from tideflow.kube.volcano import GangShape, gang_volcano_job

NS = "tideflow"
BROKER = service_account(NS, "tideflow-broker")
STARTED = "2026-11-23T06:00:00Z"
PRIORITY = {
    "job-a": "tideflow-training",
    "job-b": "tideflow-training-high",
    "job-c": "tideflow-training",
}


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


GPU = "nvidia.com/gpu"
QUEUE = "scheduling.volcano.sh/v1beta1"


def inference_deployment() -> dict[str, Any]:
    """The inference Deployment the broker scales, on the one node lent to it."""
    labels = {"app": "inference"}
    return {
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


def volcano_queues(vision: int = 8, nlp: int = 4, lent: int = 24) -> list[dict[str, Any]]:
    """deploy/'s Volcano queues with their GPU counts sized to this 32-GPU cluster: the
    teams' deserved, the parent's deserved their sum (as the manifest says), the parent's
    capability what the broker last lent."""
    queues = {d["metadata"]["name"]: d for d in documents(DEPLOY / "volcano-queues.yaml")}
    assert set(queues) == {"training", "vision", "nlp"}
    queues["vision"]["spec"]["deserved"] = {GPU: str(vision)}
    queues["nlp"]["spec"]["deserved"] = {GPU: str(nlp)}
    queues["training"]["spec"]["deserved"] = {GPU: str(vision + nlp)}
    queues["training"]["spec"]["capability"] = {GPU: str(lent)}
    return [queues["training"], queues["vision"], queues["nlp"]]


class Cluster:
    """Four 8-GPU nodes (gpu-0 lent to inference), two training gangs, the inference
    Deployment and HPA, the training queues of deploy/."""

    def __init__(self, fake: KubeFake, held_queues: list[dict[str, Any]] | None = None) -> None:
        self.fake = fake
        fake.apply(DEPLOY / "priority-classes.yaml", DEPLOY / "broker-rbac.yaml")
        # the parent queue the broker moves and its teams, admitted by Volcano's webhook,
        # or queues the cluster already holds, stored past it
        if held_queues is None:
            fake.apply(*volcano_queues())
        else:
            fake.seed(*held_queues)
        fake.apply(DEPLOY / "kueue-queues.yaml")
        for index in range(4):
            node = fake.create(gpu_node(f"gpu-{index}", "inference" if index == 0 else None))
            fake.set_status(node, {"allocatable": {"nvidia.com/gpu": "8"}})
        fake.create(inference_deployment())
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


def grow_to(gpus: int, *victims: str) -> BrokerDecision:
    reclaims = tuple(Reclaim(v, 8, True, 0.0) for v in victims)
    return BrokerDecision(Action.GROW, gpus, gpus, gpus, reclaims=reclaims, reason="test")


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
    assert isinstance(applied, Applied)  # the one result type of both actuators
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


def test_growing_takes_the_nodes_its_evictions_emptied_not_busy_ones(
    cluster: tuple[Cluster, Any],
) -> None:
    """The policy stops job-b, alone on gpu-3; gpu-1 and gpu-2 still run job-a. The
    node handed to inference is gpu-3: labelling a node that runs a gang would put
    inference replicas beside training workers on the same GPUs' node."""
    fake, api = cluster
    fake.start_gangs()
    actuator = KubernetesActuator(api, ClusterTarget(namespace=NS, queue_kind="volcano"))
    applied = actuator.apply(grow_to(16, "job-b"))
    assert applied.evicted_pods == ("job-b-0",)
    assert applied.inference_nodes == ("gpu-0", "gpu-3")
    assert fake.node("gpu-1")["metadata"]["labels"].get("tideflow.io/pool") != "inference"


def test_told_the_nodes_the_policy_empties_one_instead_of_counting_spread_idle_gpus(
    cluster: tuple[Cluster, Any], tmp_path: Path
) -> None:
    """job-a fills gpu-1; job-c (4 GPUs) runs on gpu-2 and job-b (4) on gpu-3: 8 GPUs
    idle by count, no node empty. Inference needs one more node. Counting, the policy
    takes the idle GPUs and stops nobody, and the node inference gets still runs a
    gang; told the nodes, it stops the gang of one node and that node is taken."""
    from tideflow.broker import PolicyConfig
    from tideflow.broker.journal import DecisionJournal
    from tideflow.broker.service import observe

    fake, api = cluster
    for name, gang, gpus, node in (
        ("job-a-0", "job-a", 8, "gpu-1"),
        ("job-c-0", "job-c", 4, "gpu-2"),
        ("job-b-0", "job-b", 4, "gpu-3"),
    ):
        fake.fake.create(gang_pod(name, gang, gpus))
        fake.fake.pods.run(NS, name, node=node, started=STARTED)
    config = PolicyConfig(total_gpus=32, per_gpu_rps=1.0, node_gpus=8, headroom=0.0)
    journal = DecisionJournal(tmp_path / "broker.db")
    target = ClusterTarget(namespace=NS, queue_kind="volcano")
    counting = KubernetesActuator(api, target)
    assert counting.empty_nodes() is None
    counted = decide(
        observe(WindowedLoad(10.0, ended_only=True), counting, config, journal, 7200.0), config
    )
    assert counted.reclaims == (), counted

    actuator = KubernetesActuator(api, target, node_gpus=8)
    assert actuator.empty_nodes() == 0 and actuator.pinned_nodes() == frozenset()
    decision = decide(
        observe(WindowedLoad(10.0, ended_only=True), actuator, config, journal, 7200.0), config
    )
    assert decision.inference_gpus == 16
    assert [r.gang_id for r in decision.reclaims] == ["job-c"]  # job-b's class is higher
    applied = actuator.apply(decision)
    assert applied.evicted_pods == ("job-c-0",)
    assert applied.inference_nodes == ("gpu-0", "gpu-2")


def test_a_node_whose_gang_a_pdb_kept_is_not_handed_to_inference(
    cluster: tuple[Cluster, Any],
) -> None:
    """The PDB refuses every eviction of job-a through the grace: its nodes still run
    it, and gpu-3 runs job-b. Inference gets no node rather than a busy one."""
    fake, api = cluster
    fake.start_gangs()
    target = ClusterTarget(namespace=NS, queue_kind="volcano")
    clock = iter(range(0, 10_000, 5))
    actuator = KubernetesActuator(
        api,
        target,
        grace_s=10,
        retry_s=0.01,
        clock=lambda: float(next(clock)),
        sleep=lambda _s: None,
    )
    applied = actuator.apply(grow_to(16, "job-a"))
    assert applied.inference_nodes == ("gpu-0",) and applied.inference_gpus == 8
    assert "8 GPUs short: the other training nodes still run pods" in applied.note
    assert "(a PDB kept the evictions)" in applied.note
    for name in ("gpu-1", "gpu-2", "gpu-3"):
        assert fake.node(name)["metadata"]["labels"].get("tideflow.io/pool") != "inference"


def test_a_cordoned_or_unready_empty_node_is_not_handed_to_inference(
    cluster: tuple[Cluster, Any],
) -> None:
    """gpu-2 is cordoned (drained for maintenance) and gpu-3 not Ready; both are empty.
    Inference gets gpu-1, the one empty node it can use, and counts no other."""
    fake, api = cluster
    cordoned = dict(fake.fake.get("v1", "Node", "gpu-2"))
    cordoned["spec"] = {**cordoned["spec"], "unschedulable": True}
    fake.fake.seed(cordoned)
    fake.fake.set_status(
        fake.fake.get("v1", "Node", "gpu-3"),
        {
            "allocatable": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "Unknown"}],
        },
    )
    actuator = KubernetesActuator(api, ClusterTarget(namespace=NS), node_gpus=8)
    assert actuator.empty_nodes() == 1
    applied = actuator.apply(grow_to(32))
    assert applied.inference_nodes == ("gpu-0", "gpu-1") and applied.inference_gpus == 16
    assert "16 GPUs short" in applied.note


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
    applied = KubernetesActuator(api, target).apply(
        BrokerDecision(Action.LEND, 8, 5, 8, reason="trough")
    )
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


def test_a_quota_edit_made_while_the_broker_moves_its_own_is_kept(
    cluster: tuple[Cluster, Any],
) -> None:
    """An operator sets a borrowing limit on the training queue between the broker's
    read of the ClusterQueue and its patch, which sends ``resourceGroups`` whole: the
    operator's limit stays (the patch is a conflict, read again) beside the broker's
    quota."""
    fake, api = cluster
    actuator = KubernetesActuator(api, ClusterTarget(namespace=NS, queue_kind="kueue"))
    read = actuator.queue.custom.get_cluster_custom_object
    path = "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/training"

    def read_then_edit(*args: Any, **kwargs: Any) -> Any:
        queue = read(*args, **kwargs)
        groups = copy.deepcopy(queue["spec"]["resourceGroups"])
        gpu = groups[0]["flavors"][0]["resources"][0]
        if "borrowingLimit" not in gpu:
            gpu["borrowingLimit"] = "8"
            body = {"spec": {"resourceGroups": groups}}
            answer = fake.fake.request("PATCH", path, body=body, content_type=MERGE)
            assert answer[0] == 200, answer
        return queue

    actuator.queue.custom.get_cluster_custom_object = read_then_edit
    assert actuator.queue.set_quota(24) == 24
    queue = fake.fake.get("kueue.x-k8s.io/v1beta2", "ClusterQueue", "training")
    (gpu,) = queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    assert gpu == {"name": "nvidia.com/gpu", "nominalQuota": "24", "borrowingLimit": "8"}


def test_a_quota_already_set_is_not_written_again(cluster: tuple[Cluster, Any]) -> None:
    """Every broker step sets the quota; only a change is a write (and a watch event
    for Kueue's controller), however the stored quantity is spelled."""
    fake, api = cluster
    queue = KubernetesActuator(api, ClusterTarget(namespace=NS, queue_kind="kueue")).queue
    queue.set_quota(24)
    queue.set_quota(24)
    groups = fake.fake.get("kueue.x-k8s.io/v1beta2", "ClusterQueue", "training")["spec"]
    groups["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = "24000m"
    path = "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/training"
    answer = fake.fake.request("PATCH", path, body={"spec": groups}, content_type=MERGE)
    assert answer[0] == 200, answer
    queue.set_quota(24)
    patches = [r for r in fake.broker_requests("patch") if r.resource == "clusterqueues"]
    assert len(patches) == 1
    queue.set_quota(16)
    patches = [r for r in fake.broker_requests("patch") if r.resource == "clusterqueues"]
    assert len(patches) == 2


def queue_spec(fake: KubeFake, name: str) -> dict[str, Any]:
    return dict(fake.get(QUEUE, "Queue", name)["spec"])


def assert_consistent_hierarchy(fake: KubeFake) -> None:
    """The teams' deserved summed <= the parent's deserved <= its capability, and every
    queue as it is stored would be admitted afresh by Volcano's webhook."""
    queues = fake.list(QUEUE, "Queue")
    for queue in queues:
        assert validate_queue(queue, None, lambda: queues) == "", queue["metadata"]["name"]
    training = queue_spec(fake, "training")
    teams = sum(int(queue_spec(fake, t)["deserved"][GPU]) for t in ("vision", "nlp"))
    assert teams <= int(training["deserved"][GPU]) <= int(training["capability"][GPU])


def test_the_training_queue_follows_the_lent_gpus_within_volcanos_hierarchy(
    cluster: tuple[Cluster, Any],
) -> None:
    """Defect 5. Volcano's queue webhook (validate_queue.go validateResourceQuantityOfQueue
    and validateChildrenConstraints, on the broker's update of the parent) admits the
    parent's capability only at or above its deserved, which covers the teams' deserved
    (8 + 4 here). Lending 0, 8 (below the teams' 12) and 16 to 32: every patch is admitted,
    the capability is the GPUs lent or, below the teams' deserved, that deserved, and the
    hierarchy stays consistent; deserved is the operator's and never moves."""
    fake, api = cluster
    actuator = KubernetesActuator(api, ClusterTarget(namespace=NS), grace_s=30, retry_s=0.01)
    seen = []
    for inference in (16, 32, 24, 8, 0, 24):
        applied = actuator.apply(grow_to(inference))
        lent = 32 - applied.inference_gpus
        training = queue_spec(fake.fake, "training")
        seen.append((lent, training["capability"], training["deserved"]))
        assert ("held at its deserved 12" in applied.note) == (lent < 12)
        assert_consistent_hierarchy(fake.fake)
    assert seen == [
        (16, {GPU: "16"}, {GPU: "12"}),
        (0, {GPU: "12"}, {GPU: "12"}),
        (8, {GPU: "12"}, {GPU: "12"}),
        (24, {GPU: "24"}, {GPU: "12"}),
        (32, {GPU: "32"}, {GPU: "12"}),
        (8, {GPU: "12"}, {GPU: "12"}),
    ]
    queue_calls = [(r.verb, r.code) for r in fake.broker_requests() if r.resource == "queues"]
    assert queue_calls == [("get", 200), ("patch", 200)] * 6  # none refused


@pytest.mark.parametrize(
    ("queues", "reasons"),
    [
        # the old deploy/ manifest, as a cluster may still hold it from before the webhook
        # had hierarchy rules: a parent without deserved under teams that have it
        (
            [
                {"name": "training", "capability": {GPU: "24"}},
                {"name": "vision", "parent": "training", "deserved": {GPU: "8"}},
                {"name": "nlp", "parent": "training", "deserved": {GPU: "4"}},
            ],
            (
                "(16 GPUs lent, deserved unset)",
                # refused at the first team summed, in the order the webhook lists them
                "queue training validation failed: sum of children's deserved (cpu 0.00, "
                "memory 0.00, nvidia.com/gpu ",
                ") exceeds parent's deserved limit (cpu 0.00, memory 0.00)",
            ),
        ),
        # a team queue with a GPU capability of its own, above what the broker lends
        (
            [
                {"name": "training", "capability": {GPU: "24"}, "deserved": {GPU: "4"}},
                {"name": "vision", "parent": "training", "capability": {GPU: "20"}},
                {"name": "nlp", "parent": "training", "deserved": {GPU: "4"}},
            ],
            (
                "(16 GPUs lent, deserved 4)",
                "queue training capability[nvidia.com/gpu]=16000.00 is smaller than its "
                "descendants' max capability=20000.00",
            ),
        ),
    ],
)
def test_a_training_queue_patch_volcano_refuses_is_a_clear_error(
    queues: list[dict[str, Any]], reasons: tuple[str, ...]
) -> None:
    """Hierarchies whose refusal the broker cannot foresee from the parent alone (its role
    reads the training queue, not the teams'): the webhook's reason reaches the broker's
    log as TrainingQueueRefusedError, naming the queue, the capability and the fix."""
    held = [
        {
            "apiVersion": QUEUE,
            "kind": "Queue",
            "metadata": {"name": queue["name"]},
            "spec": {"reclaimable": True, **{k: v for k, v in queue.items() if k != "name"}},
        }
        for queue in queues
    ]
    with KubeFake() as fake:
        Cluster(fake, held)
        actuator = KubernetesActuator(
            fake.client(BROKER), ClusterTarget(namespace=NS), grace_s=30, retry_s=0.01
        )
        with pytest.raises(TrainingQueueRefusedError) as refused:
            actuator.apply(grow_to(16))
        message = str(refused.value)
        assert message.startswith(
            "Volcano refused capability nvidia.com/gpu=16 on the training queue training"
        )
        for reason in (*reasons, "(deploy/kubernetes/volcano-queues.yaml)"):
            assert reason in message
        assert queue_spec(fake, "training")["capability"] == {GPU: "24"}  # left as it was


def test_the_broker_never_patches_volcanos_root_queue(cluster: tuple[Cluster, Any]) -> None:
    """validate_queue.go AdmitQueues: the root queue's capability, deserved and guarantee
    cannot be modified (--enable-root-queue-protection, on by default). A broker set to
    move root says so before it asks."""
    fake, api = cluster
    target = ClusterTarget(namespace=NS, training_queue="root")
    with pytest.raises(ValueError, match="cannot be Volcano's root queue"):
        KubernetesActuator(api, target)._set_training_quota(16)
    assert fake.broker_requests() == []


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
        GangView(
            "job-a", 16, 1000, committed.created_at, nodes=("gpu-1", "gpu-2"), started_s=started
        ),
        GangView("job-b", 4, 10000, started, nodes=("gpu-3",), started_s=started),
    )
    assert actuator.idle_training_gpus() == 24 - 16 - 4


def test_a_pod_holds_its_effective_request_init_containers_included(
    cluster: tuple[Cluster, Any],
) -> None:
    """The scheduler reserves a pod's effective request for its whole life: the larger
    of its containers' sum and its highest init container, a sidecar (an init container
    with ``restartPolicy: Always``) adding to both (Kubernetes: "Resource sharing within
    containers"). A 1-GPU worker with a 1-GPU profiler beside it, whose GPU check ran on
    2 beside the profiler, holds 3: gpu-3, with job-b's 4, has 1 idle. The old code
    summed the containers' requests (1); a sidecar read as a plain init container
    would give 2."""
    fake, api = cluster
    fake.start_gangs()
    pod = gang_pod("job-c-0", "job-c", 1)
    pod["spec"]["initContainers"] = [
        {
            "name": "profiler",
            "image": "registry.example.com/profiler:1",
            "restartPolicy": "Always",
            "resources": {"requests": {GPU: "1"}, "limits": {GPU: "1"}},
        },
        {
            "name": "gpu-check",
            "image": "registry.example.com/check:1",
            "resources": {"requests": {GPU: "2"}, "limits": {GPU: "2"}},
        },
    ]
    fake.fake.create(pod)
    fake.fake.pods.run(NS, "job-c-0", node="gpu-3", started=STARTED)
    actuator = KubernetesActuator(api, ClusterTarget(namespace=NS))
    assert actuator.idle_training_gpus() == 24 - 16 - 4 - 3


def test_the_brokers_role_covers_every_call_it_makes(cluster: tuple[Cluster, Any]) -> None:
    """Every call above is made as the broker and allowed by deploy/'s RBAC; the grants it
    never uses are listed here, so a change to either shows."""
    fake, api = cluster
    fake.start_gangs()
    # a Volcano Job of gang job-a's: the broker counts its stop on it
    # (tideflow.broker.volcano_stops) and reads the count back
    shape = GangShape(
        name="job-a-vc",
        labels={},
        command=["python", "-m", "train"],
        env={},
        workers=1,
        device_class="gpu",
        devices_per_worker=1,
        model="H100",
        team="vision",
        priority=0,
        max_restarts=1,
    )
    fake.fake.seed(gang_volcano_job(shape, "job-a", KubeSettings(namespace=NS)))
    volcano = ClusterTarget(namespace=NS, queue_kind="volcano")
    KubernetesActuator(api, volcano).preemption_counts()
    KubernetesActuator(
        api, volcano, grace_s=30, retry_s=0.01, sleep=lambda _s: fake.allow_disruptions(2)
    ).apply(grow_to(16, "job-a"))
    kueue = ClusterTarget(namespace=NS, hpa="inference", queue_kind="kueue")
    KubernetesActuator(api, kueue).apply(BrokerDecision(Action.LEND, 8, 5, 8, reason="trough"))
    KubernetesActuator(api, kueue).preemption_counts()
    assert all(r.code < 400 or r.code == 429 for r in fake.broker_requests())
    unused = {(g.resource, g.verb, g.name) for g in fake.fake.rbac.unused(BROKER, NS)}
    assert unused == {
        ("pods", "get", ""),
        ("pods", "watch", ""),
        ("nodes", "watch", ""),
        ("horizontalpodautoscalers", "get", "inference"),
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
