"""The Kubernetes broker as a tenant: when its cluster file declares a team ``inference``,
it keeps to that team's rules, as the local broker does (tests/broker/test_broker_tenant.py).

No API server can run here, so the Kubernetes fake (tests/kubefake) plays one for the
official client, as in tests/broker/test_broker_kubernetes.py: the broker calls it as its own
ServiceAccount (deploy/kubernetes/broker-rbac.yaml), its evictions go through the
eviction subresource (a PodDisruptionBudget refuses while the test says so), and the
queues are what ``tideflow compile`` makes of the same file, admitted by the fake's
Kueue and Volcano webhooks and, for a JobSet, by its Kueue quota admission.

The file: four 8-GPU H100 nodes, the broker's pool; inference's nominal quota is 16 of
them, vision's and nlp's 8 each, and only vision may borrow of inference's, up to half.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.broker.test_broker_kubernetes import inference_deployment
from tests.fakes import Clock
from tests.kubefake import DEPLOY, KubeFake, service_account
from tests.kubefake.kueue import NotAdmittedError
from tests.kubefake.volcano_queue_webhook import validate_queue
from tideflow.backends import GangJob, WorkerSlot
from tideflow.backends.kubernetes import KubernetesBackend
from tideflow.broker import Action, BrokerDecision, Reclaim
from tideflow.broker.kubernetes import ClusterTarget, KubernetesActuator, target_from_env
from tideflow.compile.kueue_queues import kueue_objects
from tideflow.compile.volcano_queues import volcano_objects
from tideflow.inventory import ClusterSpec
from tideflow.kube import KubeSettings
from tideflow.kube.names import dns_label
from tideflow.kube.volcano import GangShape
from tideflow.spec.loader import load_model

NS = "tideflow"
BROKER = service_account(NS, "tideflow-broker")
WORKER = service_account(NS, "tideflow-airflow-worker")
GPU = "nvidia.com/gpu"
H100 = "NVIDIA-H100-80GB-HBM3"

TEAMS = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: lab}
nodes:
  - name: h100
    count: 4
    cpu: 96
    memory: 1Ti
    accelerators: {class: gpu, model: H100, count: 8}
    labels: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3, tideflow.io/pool: training}
teams:
  - {name: inference, quota: [{device: gpu, model: H100, nominal: 16}]}
  - {name: vision, quota: [{device: gpu, model: H100, nominal: 8}]}
  - {name: nlp, quota: [{device: gpu, model: H100, nominal: 8}]}
borrowing:
  - {lender: inference, borrower: vision, max_borrowable_ratio: 0.5, grace: 2m}
"""
# The same teams without inference: the broker is no tenant.
NO_INFERENCE = TEAMS.split("borrowing:", maxsplit=1)[0].replace(
    "  - {name: inference, quota: [{device: gpu, model: H100, nominal: 16}]}\n", ""
)


def teams_file(tmp_path: Path, text: str = TEAMS) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


def compiled(path: Path, engine: str) -> list[dict[str, Any]]:
    spec = load_model(path, ClusterSpec)
    objects, _ = (kueue_objects if engine == "kueue" else volcano_objects)(spec)
    return objects


def gang_pod(name: str, gang: str, team: str | None, gpus: int = 8) -> dict[str, Any]:
    labels = {"tideflow.io/gang": gang} | ({"tideflow.io/team": team} if team else {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {
            "priorityClassName": "tideflow-training",
            "containers": [
                {
                    "name": "worker",
                    "image": "registry.example.com/train:1",
                    "resources": {"requests": {GPU: str(gpus)}, "limits": {GPU: str(gpus)}},
                }
            ],
        },
    }


class Cluster:
    """Four 8-GPU H100 nodes, gpu-0 in the inference pool; the inference Deployment; the
    queues compiled from ``cluster_file`` for ``engine``, the file the broker is given."""

    def __init__(self, fake: KubeFake, cluster_file: Path, engine: str = "kueue") -> None:
        self.fake = fake
        self.cluster_file = cluster_file
        self.engine = engine
        self.budgets: set[str] = set()
        fake.apply(DEPLOY / "priority-classes.yaml", DEPLOY / "broker-rbac.yaml")
        fake.apply(*compiled(cluster_file, engine))
        for index in range(4):
            labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": H100}
            pool = "inference" if index == 0 else "training"
            labels["tideflow.io/pool"] = pool
            node = fake.create(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": f"gpu-{index}", "labels": labels},
                    "spec": {
                        "taints": [
                            {"key": "tideflow.io/pool", "value": pool, "effect": "NoSchedule"}
                        ]
                    },
                }
            )
            fake.set_status(node, {"allocatable": {GPU: "8"}})
        fake.create(inference_deployment())

    def run(self, gang: str, team: str | None, node: str, started: str) -> None:
        name = f"{gang}-0"
        self.fake.create(gang_pod(name, gang, team))
        self.fake.pods.run(NS, name, node=node, started=started)

    def budget(self, gang: str, allowed: int) -> None:
        """A PodDisruptionBudget over ``gang``'s pods that allows ``allowed`` disruptions."""
        name = f"{gang}-budget"
        if name not in self.budgets:
            self.budgets.add(name)
            self.fake.create(
                {
                    "apiVersion": "policy/v1",
                    "kind": "PodDisruptionBudget",
                    "metadata": {"name": name, "namespace": NS},
                    "spec": {
                        "maxUnavailable": 0,
                        "selector": {"matchLabels": {"tideflow.io/gang": gang}},
                    },
                }
            )
        budget = self.fake.get("policy/v1", "PodDisruptionBudget", name)
        self.fake.set_status(
            budget,
            {
                "disruptionsAllowed": allowed,
                "currentHealthy": 1,
                "desiredHealthy": 1,
                "expectedPods": 1,
            },
        )

    def actuator(
        self, clock: Clock | None = None, grace_s: float = 30.0, *, given_file: bool = True
    ) -> KubernetesActuator:
        clock = clock or Clock(0.0)
        target = ClusterTarget(
            namespace=NS,
            queue_kind=self.engine,
            kueue_flavor="h100" if self.engine == "kueue" else None,
            cluster_file=str(self.cluster_file) if given_file else None,
        )
        return KubernetesActuator(
            self.fake.client(BROKER),
            target,
            grace_s=grace_s,
            retry_s=5.0,
            clock=clock,
            sleep=clock.sleep,
        )

    def pools(self) -> dict[str, str]:
        return {
            n["metadata"]["name"]: n["metadata"]["labels"]["tideflow.io/pool"]
            for n in self.fake.list("v1", "Node")
        }

    def evictions(self) -> list[Any]:
        return [r for r in self.fake.requests_by(BROKER) if r.resource == "pods/eviction"]

    def training_quota(self) -> int:
        queue = self.fake.get("kueue.x-k8s.io/v1beta2", "ClusterQueue", "training")
        (flavor,) = queue["spec"]["resourceGroups"][0]["flavors"]
        return int(flavor["resources"][0]["nominalQuota"])


@pytest.fixture
def fake() -> Iterator[KubeFake]:
    with KubeFake() as cluster:
        yield cluster


def to(gpus: int, *victims: str) -> BrokerDecision:
    """What the policy decides; its victims are those it would take without teams."""
    reclaims = tuple(Reclaim(v, 8, True, 0.0) for v in victims)
    action = Action.GROW if gpus > 8 else Action.LEND
    return BrokerDecision(action, gpus, gpus, gpus, reclaims=reclaims, reason="test")


def test_the_broker_is_capped_at_inferences_quota_and_reclaims_its_borrower_with_its_grace(
    fake: KubeFake, tmp_path: Path
) -> None:
    """Vision runs one gang within its own quota, then one more that borrows inference's
    idle quota (the file's rule inference -> vision, grace 2m); nlp runs within its own.
    The policy would take every GPU: the broker takes inference's 16 and no more, and of
    the gangs only the borrower is evicted, its eviction waiting the rule's 120 s for the
    budget (not the broker's own grace_s of 30) and giving its pods that grace (the
    Eviction's deleteOptions.gracePeriodSeconds, policy/v1; the fake deletes with the
    pod's own terminationGracePeriodSeconds, so the request is what is checked)."""
    cluster = Cluster(fake, teams_file(tmp_path))
    cluster.run("vision-own", "vision", "gpu-1", "2026-11-23T06:00:00Z")
    cluster.run("vision-borrows", "vision", "gpu-2", "2026-11-23T07:00:00Z")
    cluster.run("nlp-own", "nlp", "gpu-3", "2026-11-23T05:00:00Z")
    cluster.budget("vision-borrows", 0)  # refuses until 100 s have passed
    clock = Clock(0.0, on_sleep=lambda now: cluster.budget("vision-borrows", int(now >= 100)))
    actuator = cluster.actuator(clock, grace_s=30)

    applied = actuator.apply(to(32, "vision-own", "nlp-own", "vision-borrows"))

    assert applied.inference_gpus == 16
    assert "capped at inference's quota of 16" in applied.note
    assert applied.evicted_pods == ("vision-borrows-0",) and applied.refused_by_pdb == ()
    assert cluster.pools() == {
        "gpu-0": "inference",
        "gpu-1": "training",
        "gpu-2": "inference",  # the borrower's node
        "gpu-3": "training",
    }
    evictions = cluster.evictions()
    assert {r.body["metadata"]["name"] for r in evictions} == {"vision-borrows-0"}
    assert evictions[-1].code == 201 and clock.now >= 100
    assert evictions[-1].body["deleteOptions"]["gracePeriodSeconds"] == 120
    assert cluster.training_quota() == 16


def test_a_gang_within_its_teams_quota_is_never_evicted_nor_one_no_rule_lends_to(
    fake: KubeFake, tmp_path: Path
) -> None:
    """Vision and nlp each run within their own quota, and nlp a second gang beyond it,
    which no rule lets it borrow of inference. The policy names all three; the broker
    stops none, keeps the nodes they run on, and says why it is short."""
    cluster = Cluster(fake, teams_file(tmp_path))
    cluster.run("vision-own", "vision", "gpu-1", "2026-11-23T06:00:00Z")
    cluster.run("nlp-own", "nlp", "gpu-2", "2026-11-23T05:00:00Z")
    cluster.run("nlp-more", "nlp", "gpu-3", "2026-11-23T07:00:00Z")

    applied = cluster.actuator().apply(to(16, "vision-own", "nlp-own", "nlp-more"))

    assert applied.inference_gpus == 8 and applied.evicted_pods == ()
    assert cluster.evictions() == []
    assert [n for n, p in cluster.pools().items() if p == "inference"] == ["gpu-0"]
    assert "8 GPUs short" in applied.note
    for gang in ("nlp-more", "nlp-own", "vision-own"):
        assert gang in applied.note


def test_the_broker_lends_no_more_than_inferences_rules_let_anyone_borrow(
    fake: KubeFake, tmp_path: Path
) -> None:
    """Kueue lends the training ClusterQueue's pool to any team of the cohort (the compiled
    queues say so; the rules bind nothing there), so the broker lends of inference's 16 only
    what its one rule lets vision borrow (half: 8): lending all, it keeps one node, and the
    training queue's nominalQuota stays at nlp's and vision's 16 plus those 8. Kueue's
    admission then admits a vision JobSet of 24 GPUs and not one of 32: a ClusterQueue
    borrows only the unused nominalQuota of the cohort's others (reference/upstream/kueue/
    site/content/en/docs/concepts/cluster_queue.md, "Flavors and borrowing semantics", as
    tests/kubefake/kueue.py plays it)."""
    cluster = Cluster(fake, teams_file(tmp_path))
    actuator = cluster.actuator()
    applied = actuator.apply(to(0))
    assert applied.inference_gpus == 8 and cluster.training_quota() == 24
    assert "held at 8: inference's rules lend at most 8 of its quota of 16" in applied.note

    backend = KubernetesBackend(
        fake.client(WORKER), KubeSettings(namespace=NS, gang_scheduler="kueue")
    )
    for gang_id, workers in (("vision/too-big", 4), ("vision/fits", 3)):
        backend.submit(
            GangJob(
                gang_id,
                ("python", "-m", "train"),
                {},
                tuple(WorkerSlot(rank, "", tuple(range(8))) for rank in range(workers)),
                "gpu",
                False,
                0,
                team="vision",
                model="H100",
            )
        )
    with pytest.raises(NotAdmittedError, match="insufficient quota"):
        fake.kueue.admit(NS, backend.job_name("vision/too-big"))
    assert fake.kueue.admit(NS, backend.job_name("vision/fits")) == {GPU: "h100"}

    # growing back to the quota and lending again moves the quota within the same bounds
    assert actuator.apply(to(16)).inference_gpus == 16 and cluster.training_quota() == 16
    assert actuator.apply(to(0)).inference_gpus == 8 and cluster.training_quota() == 24


def test_volcanos_parent_queue_keeps_the_hierarchy_the_compiler_made(
    fake: KubeFake, tmp_path: Path
) -> None:
    """Volcano's queue webhook (reference/upstream/volcano/pkg/webhooks/admission/queues/
    validate/validate_queue.go, validateChildrenConstraints) admits the broker's capability
    on the compiled parent queue as before: the GPUs lent, never below the teams' deserved
    summed (inference's 16 among them, so here always 32)."""
    cluster = Cluster(fake, teams_file(tmp_path), engine="volcano")
    actuator = cluster.actuator()
    for gpus in (16, 0, 32):
        applied = actuator.apply(to(gpus))
        queues = fake.list("scheduling.volcano.sh/v1beta1", "Queue")
        for queue in queues:
            held = queues
            assert validate_queue(queue, None, lambda held=held: held) == "", queue["metadata"][
                "name"
            ]
        training = next(q for q in queues if q["metadata"]["name"] == "training")["spec"]
        assert training["capability"] == {GPU: str(max(32 - applied.inference_gpus, 32))}
        assert applied.inference_gpus == min(max(gpus, 8), 16)


def run_without_inference(cluster_file: Path, *, given_file: bool) -> tuple[Any, list[Any]]:
    with KubeFake() as fake:
        cluster = Cluster(fake, cluster_file)
        cluster.run("vision-own", "vision", "gpu-1", "2026-11-23T06:00:00Z")
        cluster.run("nlp-own", "nlp", "gpu-2", "2026-11-23T05:00:00Z")
        actuator = cluster.actuator(given_file=given_file)
        applied = actuator.apply(to(24, "vision-own", "nlp-own"))
        calls = [(r.verb, r.resource, r.name, r.code) for r in fake.requests_by(BROKER)]
        return applied, calls


def test_a_file_without_team_inference_leaves_the_broker_as_it_was(tmp_path: Path) -> None:
    """Teams without inference: the broker is no tenant, and acts as with no file at all
    (the policy's victims evicted, the nodes it wants taken, the whole pool lent)."""
    path = teams_file(tmp_path, NO_INFERENCE)
    with_teams = run_without_inference(path, given_file=True)
    without = run_without_inference(path, given_file=False)
    assert with_teams == without
    applied, _ = with_teams
    assert applied.inference_gpus == 24
    assert applied.evicted_pods == ("vision-own-0", "nlp-own-0")


def test_the_broker_reads_its_cluster_file_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("TIDEFLOW_CLUSTER_FILE", raising=False)
    assert target_from_env().cluster_file is None
    monkeypatch.setenv("TIDEFLOW_CLUSTER_FILE", str(teams_file(tmp_path)))
    assert target_from_env().cluster_file == str(tmp_path / "cluster.yaml")


def test_gang_pods_carry_their_team_the_broker_reads() -> None:
    """The label the broker reads a gang's team from is on the pods of both gang kinds
    (their pod templates' labels), as the team's DNS label."""
    from tideflow.kube.jobset import gang_jobset
    from tideflow.kube.volcano import gang_volcano_job
    from tideflow.steps.context import TEAM_LABEL

    shape = GangShape("x", {}, ["python"], {}, 1, "gpu", 8, "H100", "Vision_Team", 0, 0)
    settings = KubeSettings(namespace=NS)
    job = gang_volcano_job(shape, "digits/run/train", settings)
    jobset = gang_jobset(shape, "digits/run/train", settings)
    templates = [
        job["spec"]["tasks"][0]["template"],
        jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"],
    ]
    for template in templates:
        assert template["metadata"]["labels"][TEAM_LABEL] == dns_label("Vision_Team")


def test_whom_a_gang_borrows_from_is_the_teams_admission_replayed_in_start_order(
    tmp_path: Path,
) -> None:
    """Of vision's two gangs the one that started first holds its own quota whatever the
    policy thinks of them; the later one borrows inference's (the rule's grace). An nlp
    gang that borrows vision's quota past that rule's auto_return_timeout is returned
    for inference too, with its own rule's grace (tideflow.scheduling.quota.candidates,
    as the ledger does locally)."""
    from tideflow.broker.snapshot import GangView
    from tideflow.broker.tenant import PoolNode, borrowers, grow
    from tideflow.inventory import load_cluster
    from tideflow.scheduling.quota import Teams

    text = TEAMS.replace(
        "grace: 2m}\n",
        "grace: 2m}\n  - {lender: vision, borrower: nlp, grace: 45s, auto_return_timeout: 1h}\n",
    )
    teams = Teams.of(load_cluster(teams_file(tmp_path, text)))
    assert teams is not None
    hour = 3600.0
    now = 3 * hour  # each gang checkpointed just now: none has work at risk
    gangs = [
        GangView("vision-later", 8, 0, now, team="vision", started_s=2 * hour),
        GangView("vision-first", 8, 0, now, team="vision", started_s=1 * hour),
        GangView("nlp-own", 8, 0, now, team="nlp", started_s=0.0),
    ]
    held = {h.gang_id: h for h in borrowers(teams, gangs, 8, "gpu", "H100", now=now)}
    assert (held["vision-first"].borrowed, held["vision-later"].lender) == (0, "inference")
    nodes = [
        PoolNode("gpu-1", 8, frozenset({"vision-first"})),
        PoolNode("gpu-2", 8, frozenset({"vision-later"})),
        PoolNode("gpu-3", 8, frozenset({"nlp-own"})),
    ]
    growth = grow(
        teams,
        list(held.values()),
        nodes,
        have=8,
        target=16,
        most=16,
        device_class="gpu",
        model="H100",
        now=3 * hour,
    )
    assert growth.nodes == ("gpu-2",) and growth.kept_by == ("nlp-own", "vision-first")
    assert [(e.gang_id, e.grace_s) for e in growth.evictions] == [("vision-later", 120.0)]

    # nlp borrows vision's idle quota (vision runs nothing), past its auto_return_timeout
    late = [
        GangView("nlp-own", 8, 0, now, team="nlp", started_s=0.0),
        GangView("nlp-more", 8, 0, now, team="nlp", started_s=0.5 * hour),
    ]
    held = {h.gang_id: h for h in borrowers(teams, late, 8, "gpu", "H100", now=now)}
    assert held["nlp-more"].lender == "vision"
    growth = grow(
        teams,
        list(held.values()),
        [*nodes[2:], PoolNode("gpu-2", 8, frozenset({"nlp-more"}))],
        have=8,
        target=16,
        most=16,
        device_class="gpu",
        model="H100",
        now=2 * hour,
    )
    assert [(e.gang_id, e.grace_s) for e in growth.evictions] == [("nlp-more", 45.0)]


def broker_environment(monkeypatch: pytest.MonkeyPatch, cluster_file: Path) -> None:
    """What ``tideflow broker run --backend kubernetes`` reads: the Kueue training queue's
    flavor in the test's namespace, and the cluster file."""
    for name, value in {
        "TIDEFLOW_K8S_NAMESPACE": NS,
        "TIDEFLOW_K8S_QUEUE_KIND": "kueue",
        "TIDEFLOW_K8S_KUEUE_FLAVOR": "h100",
        "TIDEFLOW_CLUSTER_FILE": str(cluster_file),
    }.items():
        monkeypatch.setenv(name, value)


def test_the_kubernetes_brokers_policy_moves_within_what_the_tenant_may_hold(
    fake: KubeFake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tideflow broker run --backend kubernetes`` bounds its policy as the local broker
    does: at most inference's quota (16), and at least what the actuator keeps anyway
    (the 8 of it no rule lets anyone borrow), so the journal records what is held. Without
    a team inference the bounds are the settings' own."""
    from tideflow.broker.service import BrokerSettings, open_kubernetes

    path = teams_file(tmp_path)
    Cluster(fake, path)
    broker_environment(monkeypatch, path)
    settings = BrokerSettings(load="synthetic:100", per_gpu_rps=10.0, min_inference_gpus=0)

    _, actuator, config, _ = open_kubernetes(settings, tmp_path / "broker.db", fake.client(BROKER))
    assert actuator.tenant and config.total_gpus == 32
    assert (config.min_inference_gpus, config.ceiling) == (8, 16)

    other = tmp_path / "no-inference"
    other.mkdir()
    monkeypatch.setenv("TIDEFLOW_CLUSTER_FILE", str(teams_file(other, NO_INFERENCE)))
    _, actuator, config, _ = open_kubernetes(settings, tmp_path / "broker.db", fake.client(BROKER))
    assert not actuator.tenant
    assert (config.min_inference_gpus, config.ceiling) == (0, 32)

    monkeypatch.setenv("TIDEFLOW_CLUSTER_FILE", str(path))
    with pytest.raises(ValueError, match=r"holds 16 GPU.*below the broker's min_inference_gpus 24"):
        open_kubernetes(
            BrokerSettings(load="synthetic:100", per_gpu_rps=10.0, min_inference_gpus=24),
            tmp_path / "broker.db",
            fake.client(BROKER),
        )


def test_an_inference_quota_the_broker_cannot_hold_is_refused_at_open(
    fake: KubeFake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inference's quota declared for a model the broker's pool is not (here A100, the
    pool H100) gives it a ceiling of 0: rather than hand every inference node to
    training, the broker refuses to start, naming what to declare."""
    from tideflow.broker.service import BrokerSettings, open_kubernetes

    path = teams_file(tmp_path)
    Cluster(fake, path)
    path.write_text(
        TEAMS.replace(
            "{name: inference, quota: [{device: gpu, model: H100, nominal: 16}]}",
            "{name: inference, quota: [{device: gpu, model: A100, nominal: 16}]}",
        ).replace(
            "teams:\n",
            "  - name: a100\n    count: 2\n    cpu: 96\n    memory: 1Ti\n"
            "    accelerators: {class: gpu, model: A100, count: 8}\nteams:\n",
        )
    )
    broker_environment(monkeypatch, path)
    settings = BrokerSettings(load="synthetic:100", per_gpu_rps=10.0)
    with pytest.raises(ValueError, match=r"holds no whole node of 8 GPU\(s\).*quota 0"):
        open_kubernetes(settings, tmp_path / "broker.db", fake.client(BROKER))


def test_a_borrowers_node_a_pdb_kept_it_on_is_not_handed_to_inference(
    fake: KubeFake, tmp_path: Path
) -> None:
    """Vision's borrower runs on gpu-2 and its PodDisruptionBudget refuses every eviction
    through the rule's grace: the pod still runs there, so gpu-2 stays training's (its
    taint would otherwise sit under a running worker beside inference's replicas) and
    the note says a PDB kept it."""
    cluster = Cluster(fake, teams_file(tmp_path))
    cluster.run("vision-own", "vision", "gpu-1", "2026-11-23T06:00:00Z")
    cluster.run("vision-borrows", "vision", "gpu-2", "2026-11-23T07:00:00Z")
    cluster.run("nlp-own", "nlp", "gpu-3", "2026-11-23T05:00:00Z")
    cluster.budget("vision-borrows", 0)  # never allows

    applied = cluster.actuator(grace_s=30).apply(to(16, "vision-borrows"))

    assert applied.refused_by_pdb == ("vision-borrows-0",)
    assert applied.inference_gpus == 8
    assert cluster.pools()["gpu-2"] == "training"
    assert "8 GPUs short: a PDB kept pods on gpu-2; PDB kept vision-borrows-0" in applied.note


def test_a_cordoned_or_unready_node_is_not_taken_by_the_tenant_broker(
    fake: KubeFake, tmp_path: Path
) -> None:
    """gpu-1 is cordoned and gpu-2 not Ready, both empty; gpu-3 is empty and usable.
    Growing to inference's quota takes gpu-3, not the first empty node by name."""
    cluster = Cluster(fake, teams_file(tmp_path))
    cordoned = dict(fake.get("v1", "Node", "gpu-1"))
    cordoned["spec"] = {**cordoned["spec"], "unschedulable": True}
    fake.seed(cordoned)
    fake.set_status(
        fake.get("v1", "Node", "gpu-2"),
        {"allocatable": {GPU: "8"}, "conditions": [{"type": "Ready", "status": "False"}]},
    )

    applied = cluster.actuator().apply(to(16))

    assert applied.inference_gpus == 16
    assert [n for n, p in cluster.pools().items() if p == "inference"] == ["gpu-0", "gpu-3"]


def test_a_node_running_a_pod_of_no_gang_is_not_taken_by_the_tenant_broker(
    fake: KubeFake, tmp_path: Path
) -> None:
    """gpu-1 runs a GPU pod that belongs to no tideflow gang (someone's notebook): the
    broker never evicts it, so gpu-1 is not empty and inference takes gpu-2 instead."""
    cluster = Cluster(fake, teams_file(tmp_path))
    pod = gang_pod("notebook-0", "x", None)
    del pod["metadata"]["labels"]["tideflow.io/gang"]
    fake.create(pod)
    fake.pods.run(NS, "notebook-0", node="gpu-1", started="2026-11-23T04:00:00Z")

    applied = cluster.actuator().apply(to(16))

    assert applied.inference_gpus == 16 and applied.evicted_pods == ()
    assert [n for n, p in cluster.pools().items() if p == "inference"] == ["gpu-0", "gpu-2"]


def test_with_every_node_left_cordoned_the_note_says_so(fake: KubeFake, tmp_path: Path) -> None:
    """gpu-1, gpu-2 and gpu-3 are all cordoned: inference keeps gpu-0 and the note names
    the cordoned nodes rather than inference's quota."""
    cluster = Cluster(fake, teams_file(tmp_path))
    for name in ("gpu-1", "gpu-2", "gpu-3"):
        node = dict(fake.get("v1", "Node", name))
        node["spec"] = {**node["spec"], "unschedulable": True}
        fake.seed(node)

    applied = cluster.actuator().apply(to(16))

    assert applied.inference_gpus == 8
    assert "8 GPUs short: cordoned or not Ready: gpu-1, gpu-2, gpu-3" in applied.note


def _taints(fake: KubeFake, name: str) -> list[dict[str, Any]]:
    return list(fake.get("v1", "Node", name)["spec"].get("taints", []))


HEALTH = {"key": "nvidia.com/gpu.health", "value": "degraded", "effect": "PreferNoSchedule"}


def wait_on_the_borrower(fake: KubeFake, tmp_path: Path, *, cordon: bool) -> Any:
    """Vision's borrower runs on gpu-2, the other nodes run gangs inference may not stop;
    its PDB lets it go at 100 s. While the broker waits, a health check taints gpu-2
    (and, with ``cordon``, cordons it). The broker grows to inference's 16."""
    cluster = Cluster(fake, teams_file(tmp_path))
    cluster.run("vision-own", "vision", "gpu-1", "2026-11-23T06:00:00Z")
    cluster.run("vision-borrows", "vision", "gpu-2", "2026-11-23T07:00:00Z")
    cluster.run("nlp-own", "nlp", "gpu-3", "2026-11-23T05:00:00Z")
    cluster.budget("vision-borrows", 0)

    def meanwhile(now: float) -> None:
        cluster.budget("vision-borrows", int(now >= 100))
        node = dict(fake.get("v1", "Node", "gpu-2"))
        if HEALTH not in node["spec"].get("taints", []):
            spec = {**node["spec"], "taints": [*node["spec"].get("taints", []), HEALTH]}
            node["spec"] = spec | ({"unschedulable": True} if cordon else {})
            fake.seed(node)

    applied = cluster.actuator(Clock(0.0, on_sleep=meanwhile)).apply(to(16, "vision-borrows"))
    assert applied.evicted_pods == ("vision-borrows-0",)
    return cluster, applied


def test_a_taint_added_while_the_broker_waits_is_kept(fake: KubeFake, tmp_path: Path) -> None:
    """The broker sends a node's taint list back whole, so it reads the node again after
    the wait: gpu-2 is taken with the health taint it gained meanwhile."""
    cluster, applied = wait_on_the_borrower(fake, tmp_path, cordon=False)
    assert applied.inference_gpus == 16 and cluster.pools()["gpu-2"] == "inference"
    taints = fake.get("v1", "Node", "gpu-2")["spec"]["taints"]
    assert HEALTH in taints
    assert {"key": "tideflow.io/pool", "value": "inference", "effect": "NoSchedule"} in taints


def test_a_node_cordoned_while_the_broker_waits_is_not_taken(
    fake: KubeFake, tmp_path: Path
) -> None:
    cluster, applied = wait_on_the_borrower(fake, tmp_path, cordon=True)
    assert applied.inference_gpus == 8 and cluster.pools()["gpu-2"] == "training"
    assert "8 GPUs short: gpu-2 became busy, cordoned or not Ready during the wait" in (
        applied.note
    )
