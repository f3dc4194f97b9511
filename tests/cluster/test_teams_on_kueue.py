"""Teams on real Kueue against the local ledger: the same arrivals, the same decisions.

Each scenario is a list of gang arrivals. On the cluster each gang is a JobSet
submitted by the Kubernetes backend into its team's LocalQueue, compiled from
the cluster file by ``tideflow compile --target kueue``; kwok ends each worker
after its run time. What Kueue decides is read from its Workloads (admitted:
``QuotaReserved``; preempted: ``Evicted`` with reason ``Preempted``). The same
arrivals go through the ``LeaseLedger`` of the same cluster file; a gang the
ledger asks to stop stops at once (its grace is the ledger's business, tested
elsewhere). The two sequences of admissions and preemptions must be equal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import NAMESPACE, service_account
from tests.cluster.test_gangs import SETTINGS, WORKER, gang
from tests.fakes import Clock
from tideflow.backends.kubernetes import KubernetesBackend
from tideflow.compile.kueue_queues import kueue_objects
from tideflow.inventory import ClusterSpec, load_cluster
from tideflow.scheduling import GangRequest, Lease, LeaseLedger
from tideflow.spec.loader import load_model
from tideflow.stack.cluster.kubeapi import Kube
from tideflow.stack.cluster.nodes import cluster_nodes
from tideflow.stack.cluster.state import ClusterState

THREE_TEAMS = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: three}
nodes:
  - {name: l4, count: 8, cpu: 8, accelerators: {class: gpu, model: L4, count: 1}}
priority_classes:
  - {name: urgent, value: 1000, preempts: true}
  - {name: normal, value: 100}
  - {name: batch, value: 0}
teams:
  - name: prod
    quota: [{device: gpu, nominal: 2}]
    default_priority_class: normal
  - name: research
    quota: [{device: gpu, nominal: 4}]
    priority_classes: [normal, batch, urgent]
    default_priority_class: batch
  - name: batch
    quota: [{device: gpu, nominal: 2}]
    default_priority_class: batch
borrowing:
  - {lender: research, borrower: batch, grace: 20s}
  - {lender: prod, borrower: research, grace: 20s}
"""


@dataclass(frozen=True)
class Arrival:
    name: str
    team: str
    gpus: int
    klass: str
    run_for: str = "8s"


Event = tuple[str, str]  # ("admit" | "preempt", gang name)


@pytest.fixture(scope="module")
def three_teams(deployed: Any, kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("three") / "cluster.yaml"
    path.write_text(THREE_TEAMS)
    spec = load_model(path, ClusterSpec)
    kube.create_nodes(cluster_nodes(spec))
    objects, _ = kueue_objects(spec)
    kube.apply(objects, manager="tideflow-compile")
    return path


class Observer:
    """Kueue's decisions on the scenario's Workloads, in the order they are seen."""

    def __init__(self, kube: Kube, names: dict[str, str]) -> None:
        self.workloads = kube.dynamic.resources.get(
            api_version="kueue.x-k8s.io/v1beta2", kind="Workload"
        )
        self.names = names  # JobSet name -> arrival name
        self.state: dict[str, str] = {}
        self.events: list[Event] = []
        self.finished: set[str] = set()

    def watch(self, for_s: float) -> None:
        deadline = time.monotonic() + for_s
        while time.monotonic() < deadline:
            for workload in self.workloads.get(namespace=NAMESPACE).items:
                owner = workload.metadata.ownerReferences[0].name
                if owner in self.names:
                    self._see(self.names[owner], workload)
            time.sleep(0.25)

    def _see(self, name: str, workload: Any) -> None:
        conditions = (workload.status.conditions if workload.status else None) or []
        now = _phase({c.type: c for c in conditions})
        if now == self.state.get(name):
            return
        if now == "admitted":
            self.events.append(("admit", name))
        elif now == "evicted":
            self.events.append(("preempt", name))
        elif now == "finished":
            self.finished.add(name)
        self.state[name] = now


def on_kueue(
    cluster: ClusterState, kube: Kube, arrivals: list[Arrival], timeout_s: float = 240
) -> list[Event]:
    backend = KubernetesBackend(service_account(cluster, WORKER), SETTINGS)
    names = {backend.job_name(f"digits/{a.name}/train"): a.name for a in arrivals}
    observer = Observer(kube, names)
    for arrival in arrivals:
        job = gang(arrival.name, arrival.team, arrival.gpus, run_for=arrival.run_for, model="L4")
        backend.submit(
            replace(job, priority_class=arrival.klass, priority=CLASS_VALUES[arrival.klass])
        )
        observer.watch(for_s=ARRIVAL_GAP_S)  # one arrival at a time, as the replay has them
    deadline = time.monotonic() + timeout_s
    while len(observer.finished) < len(arrivals) and time.monotonic() < deadline:
        observer.watch(for_s=0.5)
    assert len(observer.finished) == len(arrivals), (observer.events, observer.finished)
    return observer.events


def _phase(conditions: dict[str, Any]) -> str:
    if "Finished" in conditions and conditions["Finished"].status == "True":
        return "finished"
    evicted = conditions.get("Evicted")
    if evicted is not None and evicted.status == "True" and evicted.reason == "Preempted":
        return "evicted"
    reserved = conditions.get("QuotaReserved")
    if reserved is not None and reserved.status == "True":
        return "admitted"
    return "pending"


ARRIVAL_GAP_S = 4.0  # on_kueue watches this long after each submission


def on_ledger(cluster_file: Path, arrivals: list[Arrival], home: Path) -> list[Event]:
    """The same arrivals through the ledger on a simulated clock: one every
    ``ARRIVAL_GAP_S``, each gang ending its run time after it was (last) admitted."""
    clock = Clock()
    ledger = LeaseLedger(home / "ledger.db", load_cluster(cluster_file), clock=clock)
    events: list[Event] = []
    running: dict[str, tuple[float, Lease]] = {}  # name -> (ends at, lease)
    waiting: list[Arrival] = []
    handled: set[tuple[str, float]] = set()
    by_name = {a.name: a for a in arrivals}

    def settle() -> None:
        changed = True
        while changed:
            changed = False
            for arrival in list(waiting):
                result = ledger.try_acquire(request(arrival), "replay", 1e6)
                if isinstance(result, Lease):
                    events.append(("admit", arrival.name))
                    running[arrival.name] = (clock.now + seconds(arrival.run_for), result)
                    waiting.remove(arrival)
                    changed = True
            for eviction in ledger.evictions():
                if (eviction.gang_id, eviction.requested_at) in handled:
                    continue
                handled.add((eviction.gang_id, eviction.requested_at))
                victim = eviction.gang_id.split("/")[1]
                events.append(("preempt", victim))
                ledger.release(running.pop(victim)[1].lease_id)
                waiting.append(by_name[victim])
                changed = True

    pending = [(1_000.0 + i * ARRIVAL_GAP_S, a) for i, a in enumerate(arrivals)]
    while pending or running or waiting:
        next_end = min((end for end, _ in running.values()), default=float("inf"))
        if pending and pending[0][0] <= next_end:
            clock.now, arrival = pending.pop(0)
            waiting.append(arrival)
        elif running:
            clock.now = next_end
            name = next(n for n, (end, _) in running.items() if end == next_end)
            ledger.release(running.pop(name)[1].lease_id)
        else:
            raise AssertionError(f"waiting with nothing running: {waiting}")
        settle()
    return events


def seconds(duration: str) -> float:
    assert duration.endswith("s"), duration
    return float(duration[:-1])


def request(arrival: Arrival) -> GangRequest:
    return GangRequest(
        f"digits/{arrival.name}/train",
        arrival.team,
        "gpu",
        None,
        arrival.gpus,
        1,
        priority=CLASS_VALUES[arrival.klass],
        priority_class=arrival.klass,
    )


# THREE_TEAMS' priority classes: a gang step resolves its class to this value
CLASS_VALUES = {"urgent": 1000, "normal": 100, "batch": 0}


# Arrival names are gang names on the one cluster of the session: unique across scenarios.
SCENARIOS = {
    # scenario 4: batch borrows research's idle quota; research asks for it back
    "borrow-then-reclaim": [
        Arrival("batch-big", "batch", 4, "batch", run_for="40s"),
        Arrival("prod-serve", "prod", 2, "normal", run_for="8s"),
        Arrival("research-own", "research", 4, "batch", run_for="8s"),
    ],
    # scenario 5: an urgent gang preempts its own team's long run, which resumes after;
    # every GPU is busy, so borrowing cannot make room
    "urgent-preempts-long": [
        Arrival("batch-busy", "batch", 2, "batch", run_for="30s"),
        Arrival("prod-busy", "prod", 2, "normal", run_for="30s"),
        Arrival("research-long", "research", 4, "batch", run_for="60s"),
        Arrival("research-urgent", "research", 2, "urgent", run_for="8s"),
    ],
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_kueue_and_the_ledger_make_the_same_decisions(
    scenario: str, three_teams: Path, kube: Kube, cluster: ClusterState, tmp_path: Path
) -> None:
    arrivals = SCENARIOS[scenario]
    expected = on_ledger(three_teams, arrivals, tmp_path)
    assert any(kind == "preempt" for kind, _ in expected), expected  # the scenario bites
    assert on_kueue(cluster, kube, arrivals) == expected
