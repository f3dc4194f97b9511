"""On a cluster the broker spends the lost-work budget from its own journal: Kueue and
Volcano keep no record of the work preemptions cost, so each step journals the GPUs
training's gangs held and the GPUs of the pods it evicted (``DecisionJournal.
training_work``), and the lend bound is scaled by them as the local ledger's usage
scales it there (tests/broker/test_broker_lost_work_budget.py).

No API server can run here: the Kubernetes fake (tests/kubefake) plays one for the
official client, as in tests/broker/test_broker_kubernetes.py, whose cluster this reuses
(four 8-GPU nodes, gpu-0 inference's; job-a on gpu-1 and gpu-2, job-b's 4 GPUs on
gpu-3). The load is a flat 5 rps at 1 rps per GPU: inference needs one node.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.broker.test_broker_kubernetes import BROKER, NS, Cluster
from tests.fakes import WindowedLoad
from tests.kubefake import KubeFake
from tideflow.broker import PolicyConfig
from tideflow.broker.journal import DecisionJournal
from tideflow.broker.kubernetes import ClusterTarget, KubernetesActuator
from tideflow.broker.service import BUDGET_S, lend_bound, rebalance_once

CONFIG = PolicyConfig(total_gpus=32, per_gpu_rps=1.0, node_gpus=8, headroom=0.0)
STEP = 600.0
HOUR = 3600.0  # a day of steps, hourly: the budget weighs the journal, not the cadence
# 5 rps in every window, the ones before time 0 included (a week of history at 7200 s).
FLAT = WindowedLoad(5.0, STEP, ended_only=True, from_s=-math.inf)


@pytest.fixture
def cluster() -> Iterator[tuple[Cluster, Any]]:
    with KubeFake() as fake:
        yield Cluster(fake), fake.client(BROKER)


def actuator_for(fake: Cluster, api: Any) -> KubernetesActuator:
    # the PDB over job-a allows its two pods to go while the broker waits
    return KubernetesActuator(
        api,
        ClusterTarget(namespace=NS, queue_kind="volcano"),
        grace_s=30,
        retry_s=0.01,
        sleep=lambda _s: fake.allow_disruptions(2),
    )


def test_each_step_journals_the_gpus_training_held_and_the_gpus_it_evicted(
    cluster: tuple[Cluster, Any], tmp_path: Path
) -> None:
    """The load jumps to 20 rps: the broker grows to three nodes, evicting job-a (two
    8-GPU pods). Its step journals the 16 GPUs it stopped and the 4 training holds
    after it (job-b's); the lend bound then weighs them."""
    fake, api = cluster
    fake.start_gangs()
    journal = DecisionJournal(tmp_path / "broker.db")
    actuator = actuator_for(fake, api)

    decision, applied = rebalance_once(
        WindowedLoad(20.0, STEP, ended_only=True, from_s=-math.inf),
        actuator,
        CONFIG,
        journal,
        now_s=7200.0,
    )

    assert [r.gang_id for r in decision.reclaims] == ["job-a"]
    assert sorted(applied.evicted_pods) == ["job-a-worker-0", "job-a-worker-1"]
    assert applied.stopped_gpus == 16
    (entry,) = journal.since(0.0)
    assert (entry.training_gpus, entry.stopped_gpus) == (4, 16)


def test_one_observation_lists_the_nodes_and_the_pods_once(
    cluster: tuple[Cluster, Any], tmp_path: Path
) -> None:
    """What a step asks of the cluster (inference's GPUs, the idle ones, empty and pinned
    nodes, the gangs, the lend bound) is answered from one listing of the nodes and one of
    the pods: the answers agree with each other, and the API server is asked twice, not
    once per question (the old code listed the nodes 6 times and the pods 3)."""
    from tideflow.broker.service import peek

    fake, api = cluster
    fake.start_gangs()
    actuator = actuator_for(fake, api)
    seen = len(fake.fake.requests)
    peek(FLAT, actuator, CONFIG, DecisionJournal(tmp_path / "broker.db"), now_s=7200.0)
    lists = Counter(r.resource for r in fake.fake.requests[seen:] if r.verb == "list")
    assert (lists["nodes"], lists["pods"]) == (1, 1)
    assert actuator.total_gpus() == 32  # outside an observation, read afresh
    assert Counter(r.resource for r in fake.fake.requests[seen:])["nodes"] == 2


def test_the_kubernetes_broker_weighs_its_journal_against_the_budget(
    cluster: tuple[Cluster, Any], tmp_path: Path
) -> None:
    """A day of steps with training on 20 GPUs and nothing stopped: under budget, the
    lend bound shrinks to its floor (the old code lent at the fixed bound here: no
    record). Then four stops of 16 GPUs within that day: 64 x 360 GPU-s (6.4 GPU-h)
    lost is more than 1% of the 20 GPUs' day (4.8 GPU-h), so the bound is the fixed
    one again."""
    fake, api = cluster
    fake.start_gangs()
    journal = DecisionJournal(tmp_path / "broker.db")
    actuator = actuator_for(fake, api)
    start = 10 * 86400.0
    for index in range(24):  # a day of steps at the flat load: nothing to move
        rebalance_once(FLAT, actuator, CONFIG, journal, now_s=start + index * HOUR)
    now = start + 24 * HOUR
    work = journal.training_work(now - BUDGET_S, now)
    assert work is not None and work.stopped_gpus == 0
    assert work.trained_gpu_s == pytest.approx(20 * 86400.0)

    under = lend_bound(FLAT, actuator, CONFIG, now, journal)
    assert under is not None and under.margin == pytest.approx(-0.25)
    assert "lost work 0.0 of a 4.8 GPU-h budget" in under.reason
    decision, _ = rebalance_once(FLAT, actuator, CONFIG, journal, now_s=now)
    assert "lend bound x0.78" in decision.reason

    for index in range(4):
        journal.record(
            now + 1 + index,
            decision,
            total_gpus=32,
            measured_rps=5.0,
            forecast_upper=5.0,
            training_gpus=20,
            stopped_gpus=16,
        )
    over = lend_bound(FLAT, actuator, CONFIG, now + STEP, journal)
    assert over is not None and over.margin == 0.0
    assert "lost work 6.4 of a 4.8 GPU-h budget" in over.reason


def test_the_journal_carries_training_forward_between_recorded_steps(tmp_path: Path) -> None:
    """Steps are recorded only when they act where the broker runs as the Airflow DAG,
    and training goes on between them: two steps a day apart, 24 then 16 training GPUs,
    count 24 GPUs for the day and 16 after, from the first step on."""
    from tideflow.broker import Action, BrokerDecision

    journal = DecisionJournal(tmp_path / "broker.db")
    hold = BrokerDecision(Action.HOLD, 8, 5, 5, reason="test")
    for at, training in ((3600.0, 24), (3600.0 + 86400.0, 16)):
        journal.record(
            at,
            hold,
            total_gpus=32,
            measured_rps=5.0,
            forecast_upper=5.0,
            training_gpus=training,
            stopped_gpus=0,
        )
    work = journal.training_work(0.0, 3600.0 + 86400.0 + STEP)
    assert work is not None
    assert work.trained_gpu_s == pytest.approx(24 * 86400.0 + 16 * STEP)


def test_a_journal_from_before_the_record_gives_no_work_and_is_upgraded(
    tmp_path: Path,
) -> None:
    """A journal written before these columns existed: its rows say nothing of training,
    so the broker keeps the fixed bound until its own steps have recorded some."""
    path = tmp_path / "broker.db"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE decisions (at_s REAL NOT NULL, action TEXT NOT NULL, "
            "inference_gpus INTEGER NOT NULL, total_gpus INTEGER NOT NULL, measured_rps REAL, "
            "forecast_upper REAL, needed INTEGER, wanted INTEGER, emergency INTEGER NOT NULL, "
            "preempted TEXT NOT NULL, reason TEXT NOT NULL, applied TEXT NOT NULL)"
        )
        db.execute(
            "INSERT INTO decisions VALUES (0, 'hold', 8, 32, 5.0, 5.0, 5, 5, 0, '[]', 'x', '')"
        )
    journal = DecisionJournal(path)
    (entry,) = journal.since(0.0)
    assert (entry.held_gpus, entry.training_gpus, entry.stopped_gpus) == (None, None, None)
    assert journal.training_work(0.0, STEP) is None


def workload(
    name: str, pods: int, gpus_per_pod: int, *, limits_only: bool = False, gang: bool = True
) -> dict[str, Any]:
    """A Kueue Workload as its JobSet integration creates one: one pod set of ``pods``
    workers asking for ``gpus_per_pod`` GPUs each, its pod template labelled as a
    tideflow gang's (or not: someone else's job) (v1beta2, checked against the CRD)."""
    labels = {"tideflow.io/gang": name} if gang else {"app": name}
    amount = {"nvidia.com/gpu": str(gpus_per_pod)} if gpus_per_pod else {"cpu": "4"}
    resources = {"limits": amount} if limits_only else {"requests": amount, "limits": amount}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "queueName": "training",
            "podSets": [
                {
                    "name": "workers",
                    "count": pods,
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "containers": [
                                {"name": "trainer", "image": "trainer:1", "resources": resources}
                            ]
                        },
                    },
                }
            ],
        },
    }


def preempted(times: int) -> dict[str, Any]:
    """The status Kueue leaves on a Workload it has preempted ``times`` times and not
    admitted again (kueue site/content/en/docs/concepts/preemption.md: the Evicted
    condition with reason Preempted; the count in ``schedulingStats.evictions``)."""
    return {
        "conditions": [
            {
                "type": "Evicted",
                "status": "True",
                "reason": "Preempted",
                "message": "Preempted to accommodate a workload due to reclamation "
                "within the cohort",
                "lastTransitionTime": "2026-11-24T10:00:00Z",
            }
        ],
        "schedulingStats": {
            "evictions": [
                {"reason": "Preempted", "underlyingCause": "InCohortReclamation", "count": times},
                {"reason": "PodsReadyTimeout", "underlyingCause": "", "count": 5},
            ]
        },
    }


def test_kueues_preemptions_of_training_count_against_the_budget_once_each(
    cluster: tuple[Cluster, Any], tmp_path: Path
) -> None:
    """Kueue preempts training workloads between teams (a cohort reclaiming its quota)
    without the broker: each step journals the rise of every Workload's preemption count
    and the lend bound weighs those stops with the broker's own. The old code counted
    only its own evictions: none here, so it lent under budget at x0.78.

    Kueue itself cannot run here: the test writes the status Kueue's controller would."""
    fake, api = cluster
    fake.start_gangs()
    actuator = KubernetesActuator(api, ClusterTarget(namespace=NS, queue_kind="kueue"))
    journal = DecisionJournal(tmp_path / "broker.db")
    a = fake.fake.create(workload("train-a", 2, 8))  # 16 GPUs
    old = fake.fake.create(workload("train-old", 1, 8))
    fake.fake.set_status(old, preempted(2))  # before the broker watched: not counted
    fake.fake.create(workload("prep", 3, 0))  # CPU only: not the broker's GPUs
    other = fake.fake.create(workload("notebook", 1, 8, gang=False))  # no tideflow gang
    start = time.time() + 1.0  # the steps' clock: the workloads above came before it
    for index in range(24):  # a day of steps, training on 20 GPUs, nothing stopped
        rebalance_once(FLAT, actuator, CONFIG, journal, now_s=start + index * HOUR)
    now = start + 24 * HOUR
    assert "lend bound x0.78" in rebalance_once(FLAT, actuator, CONFIG, journal, now)[0].reason

    fake.fake.set_status(a, preempted(1))
    fake.fake.set_status(other, preempted(4))
    rebalance_once(FLAT, actuator, CONFIG, journal, now_s=now + STEP)
    rebalance_once(FLAT, actuator, CONFIG, journal, now_s=now + 2 * STEP)  # no rise: 0
    # admitted again and preempted twice more between two steps (the Evicted condition
    # may be False by then: the count still rose)
    fake.fake.set_status(a, {"schedulingStats": preempted(3)["schedulingStats"]})
    while time.time() < start + 1.0:  # (creation times are whole seconds)
        time.sleep(0.1)
    late = fake.fake.create(workload("train-late", 1, 4, limits_only=True))
    fake.fake.set_status(late, preempted(1))  # created while watched: counted from zero
    rebalance_once(FLAT, actuator, CONFIG, journal, now_s=now + 3 * STEP)

    work = journal.training_work(now - BUDGET_S, now + 4 * STEP)
    assert work is not None and work.stopped_gpus == 16 * 3 + 4
    # 52 x 360 GPU-s is 5.2 GPU-h lost, over 1% of the 20 GPUs' day
    over = lend_bound(FLAT, actuator, CONFIG, now + 4 * STEP, journal)
    assert over is not None and over.margin == 0.0
    assert "lost work 5.2 of a 4.9 GPU-h budget" in over.reason


def _record_rising_counts(path: str, rounds: int, offset: int, together: Any) -> None:
    from tideflow.broker.journal import DecisionJournal, PreemptionCount

    journal = DecisionJournal(Path(path))
    for index in range(rounds):
        # each process sees the count at its own moment: some counts twice, some never
        count = 3 * index + offset % 3
        together.wait()  # every process steps at once
        journal.record_preemptions(float(index), [PreemptionCount("w", count, 8, created_s=0.0)])


@pytest.mark.processes
@pytest.mark.parametrize("processes", [4])
def test_concurrent_steps_count_each_preemption_once(tmp_path: Path, processes: int) -> None:
    """Several broker steps at once (the DAG's and a service's) over many rounds, each
    reading the same rising count at its own moment: the journal holds each
    preemption once, whatever the interleaving."""
    import multiprocessing

    path = tmp_path / "broker.db"
    journal = DecisionJournal(path)
    journal.record_preemptions(-1.0, [])  # watching from before the workload was created
    context = multiprocessing.get_context("spawn")
    together = context.Barrier(processes)
    workers = [
        context.Process(target=_record_rising_counts, args=(str(path), 60, offset, together))
        for offset in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    with sqlite3.connect(path) as db:
        (highest, gpus) = db.execute(
            "SELECT MAX(count), SUM(gpus) FROM scheduler_preemptions WHERE uid = 'w'"
        ).fetchone()
    assert highest == 3 * 59 + 2
    assert gpus == 8 * highest


def test_a_role_without_workloads_skips_kueues_count_and_says_why(
    cluster: tuple[Cluster, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A broker upgraded without re-applying its Role is refused the Workloads (403): the
    step that already acted must not fail for it; the count is skipped and logged."""
    from tests.kubefake import service_account

    fake, _ = cluster
    fake.fake.create(workload("train-a", 2, 8))
    stranger = fake.fake.client(service_account(NS, "no-workloads"))
    actuator = KubernetesActuator(stranger, ClusterTarget(namespace=NS, queue_kind="kueue"))
    assert actuator.preemption_counts() is None
    assert "cannot list Kueue Workloads in tideflow (403" in caplog.text
    assert "re-apply deploy/kubernetes/broker-rbac.yaml" in caplog.text
    volcano = KubernetesActuator(stranger, ClusterTarget(namespace=NS, queue_kind="volcano"))
    assert volcano.preemption_counts() is None  # nothing watched there


def test_a_preempted_gang_costs_the_gpus_its_pods_held_not_its_template_sum(
    cluster: tuple[Cluster, Any],
) -> None:
    """A preemption stops the pods a Workload still runs, each holding its effective GPU
    request. Workers that already finished are ``status.reclaimablePods`` (per pod set, a
    count of pods, as Kueue's integrations report them: for a JobSet,
    pkg/controller/jobs/jobset/jobset_controller.go, ReclaimablePods) and hold nothing.
    An init container's GPUs are held only while it runs, so a pod holds the larger of
    its highest init container and its containers' sum, and a sidecar (an init
    container with ``restartPolicy: Always``) adds to both: to the containers it runs
    beside and to the init containers declared after it (the Kubernetes pod's effective
    request, as the scheduler and Kueue count it). The old code summed the containers
    of every pod: 32, 16, 8 and 8 GPUs here, not 8, 0, 20 and 10."""
    fake, api = cluster
    actuator = KubernetesActuator(api, ClusterTarget(namespace=NS, queue_kind="kueue"))
    finished = fake.fake.create(workload("train-finished", 4, 8))  # 4 workers, 3 done
    fake.fake.set_status(
        finished, {**preempted(1), "reclaimablePods": [{"name": "workers", "count": 3}]}
    )
    # every worker done: it holds nothing, yet Kueue still holds the Workload, so it is
    # listed (the journal forgets only what the queue no longer lists)
    done = fake.fake.create(workload("train-done", 2, 8))
    fake.fake.set_status(
        done, {**preempted(1), "reclaimablePods": [{"name": "workers", "count": 2}]}
    )

    def gpus(amount: int) -> dict[str, Any]:
        return {
            "requests": {"nvidia.com/gpu": str(amount)},
            "limits": {"nvidia.com/gpu": str(amount)},
        }

    def with_init(name: str, pods: int, trainer: int, sidecar: int, check: int) -> None:
        body = workload(name, pods, trainer)
        body["spec"]["podSets"][0]["template"]["spec"]["initContainers"] = [
            # a profiler beside the trainer for the pod's whole life
            {
                "name": "profiler",
                "image": "p:1",
                "restartPolicy": "Always",
                "resources": gpus(sidecar),
            },
            # a GPU check before training, beside the profiler
            {"name": "gpu-check", "image": "c:1", "resources": gpus(check)},
            {"name": "fetch", "image": "f:1"},  # no GPU
        ]
        fake.fake.set_status(fake.fake.create(body), preempted(1))

    with_init("train-check", 2, trainer=4, sidecar=2, check=8)  # the check's 8 + 2 wins
    with_init("train-sidecar", 1, trainer=8, sidecar=2, check=4)  # the trainer's 8 + 2 wins
    by_gpus = sorted(c.gpus for c in actuator.preemption_counts() or ())
    assert by_gpus == [0, 8, 10, 2 * 10]


def test_an_init_container_asking_for_more_gpus_than_the_pod_runs_with_sets_its_request(
    cluster: tuple[Cluster, Any],
) -> None:
    """A pod's effective request is the larger of its app containers' sum and its highest
    init container (Kubernetes: "Resource sharing within containers"): one init
    container on 8 GPUs before a 4-GPU trainer holds 8."""
    fake, api = cluster
    actuator = KubernetesActuator(api, ClusterTarget(namespace=NS, queue_kind="kueue"))
    body = workload("train-warm", 1, 4)
    body["spec"]["podSets"][0]["template"]["spec"]["initContainers"] = [
        {"name": "warm", "image": "warm:1", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
    ]
    fake.fake.set_status(fake.fake.create(body), preempted(1))
    assert [c.gpus for c in actuator.preemption_counts() or ()] == [8]


def test_the_journal_forgets_workloads_gone_for_longer_than_it_keeps(tmp_path: Path) -> None:
    """Every gang Workload leaves a row in the journal (where its count starts), so on a
    busy cluster the table would grow with every job ever run. A workload gone from the
    queue (deleted, finished) for longer than the journal keeps preemptions is
    forgotten; one still listed keeps its highest count, so a rise is still counted once,
    and one gone recently still counts in the budget's span."""
    from tideflow.broker.journal import PreemptionCount

    path = tmp_path / "broker.db"
    journal = DecisionJournal(path)
    day = 86400.0
    journal.record_preemptions(0.0, [])  # watched from 0
    long, rerun = PreemptionCount("long", 2, 8, 5.0), PreemptionCount("rerun", 0, 8, 0.0)
    journal.record_preemptions(0.0, [rerun])  # a long run, first seen on day 0
    for index in range(200):  # a day of jobs, each listed once and gone
        job = PreemptionCount(f"job-{index}", 1, 8, created_s=index * 400.0)
        journal.record_preemptions(index * 400.0, [job, rerun])
    journal.record_preemptions(80000.0, [long, rerun])
    # "rerun" preempted once more on day 35, and gone after it
    journal.record_preemptions(35 * day, [long, PreemptionCount("rerun", 1, 8, 0.0)])
    recent = PreemptionCount("recent", 1, 4, created_s=39 * day)
    journal.record_preemptions(39 * day, [recent, long])
    # forty days on: the day of jobs is long gone (forgotten on day 35 already); "recent"
    # went yesterday; "rerun" went five days ago, its first row forty days ago
    journal.record_preemptions(40 * day, [PreemptionCount("long", 3, 8, created_s=5.0)])
    with sqlite3.connect(path) as db:
        uids = {uid for (uid,) in db.execute("SELECT uid FROM scheduler_preemptions")}
    assert uids == {"long", "recent", "rerun"}
    with sqlite3.connect(path) as db:
        (gpus,) = db.execute(
            "SELECT SUM(gpus) FROM scheduler_preemptions WHERE at_s >= ?", (39 * day,)
        ).fetchone()
    assert gpus == 4 + 8  # "recent" once, "long" risen from 2 to 3 once
