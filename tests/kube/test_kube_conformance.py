"""tideflow's gang objects as the upstream engines admit and run them (tests/kubefake).

Each test puts what tideflow emits (Volcano Jobs, JobSets, Argo's gang step,
deploy/'s manifests) through the one Kubernetes fake, whose admission and
controller rules are reimplemented from the upstream sources in
../shared/reference, and checks an outcome tideflow relies on. Six of them
were written against known defects: where a defect is still open its test is
marked ``xfail(strict=True)`` with the upstream rule that refuses it, so the
fix turns it into a failure that says to drop the mark.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from tests.kubefake import DEPLOY, KubeFake, service_account
from tideflow.backends import GangJob, GangState, WorkerSlot
from tideflow.backends.kubernetes import KubernetesBackend, follow
from tideflow.kube import KubeSettings
from tideflow.kube.jobset import gang_jobset
from tideflow.kube.names import gang_object_name
from tideflow.kube.volcano import EXIT_PREEMPTED, GangShape

NS = "tideflow"
WORKER = service_account(NS, "tideflow-airflow-worker")
TRIGGERER = service_account(NS, "tideflow-airflow-triggerer")
BROKER = service_account(NS, "tideflow-broker")
VOLCANO = KubeSettings(namespace=NS)
KUEUE = KubeSettings(namespace=NS, gang_scheduler="kueue")


@pytest.fixture
def fake() -> Iterator[KubeFake]:
    with KubeFake() as cluster:
        cluster.apply(DEPLOY / "priority-classes.yaml", DEPLOY / "kueue-queues.yaml")
        # Team queues as the cluster already holds them; their manifest's own admission
        # is test_volcano_queues_manifest_is_admitted.
        cluster.seed(DEPLOY / "volcano-queues.yaml")
        # tideflow's runtime writes a checkpoint and exits 75 when it is told to stop
        cluster.pods.termination_exit_code = EXIT_PREEMPTED
        yield cluster


def gang(
    gang_id: str = "vision-train/manual__2026-11-23T12:00:00+00:00/train",
    *,
    workers: int = 4,
    max_restarts: int = 2,
) -> GangJob:
    return GangJob(
        gang_id,
        ("python", "-m", "vision.train"),
        {"TIDEFLOW_CHECKPOINT_URI": "s3://tideflow/ckpt"},
        tuple(WorkerSlot(rank, "", (0,)) for rank in range(workers)),
        "gpu",
        False,
        max_restarts,
        team="vision",
        model="H100",
    )


def submit(fake: KubeFake, job: GangJob, settings: KubeSettings = VOLCANO) -> str:
    backend = KubernetesBackend(fake.client(WORKER), settings)
    backend.submit(job)
    return backend.job_name(job.gang_id)


def shape(name: str, *, workers: int = 2, max_restarts: int = 1) -> GangShape:
    return GangShape(
        name=name,
        labels={},
        command=["python", "-m", "train"],
        env={},
        workers=workers,
        device_class="gpu",
        devices_per_worker=1,
        model="H100",
        team="vision",
        priority=0,
        max_restarts=max_restarts,
    )


# -- the six defects ------------------------------------------------------------------------


def test_kueue_jobset_is_admitted_by_the_jobset_webhook(fake: KubeFake) -> None:
    """Defect 1. jobset pkg/webhooks/jobset_webhook.go validateFailurePolicy: every rule
    name must match ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$ ('unhealthy-training' did
    not). A short name keeps the pod-name rule (defect 2) out of this test."""
    created = fake.create(gang_jobset(shape("g1"), "p/r/train", KUEUE), WORKER)
    assert created["spec"]["suspend"] is True  # and Kueue's webhook took it


def test_jobset_name_fits_the_pod_name_limit_for_a_long_run_id(fake: KubeFake) -> None:
    """Defect 2. jobset_webhook.go ValidateCreate: <jobset>-<replicatedJob>-<jobIdx>-<podIdx>
    plus a 5-character suffix must be a DNS-1035 label (63 characters), for the largest
    pod index; a gang has up to 4096 workers."""
    run_id = "scheduled__2026-11-23T12:00:00.123456+00:00"
    gang_id = f"a-pipeline-with-a-rather-long-name/{run_id}/train-the-model"
    name = gang_object_name(gang_id, "kueue")
    created = fake.create(gang_jobset(shape(name, workers=4096), gang_id, KUEUE), WORKER)
    assert created["metadata"]["name"] == name


def test_volcano_exit_76_terminates_instead_of_restarting(fake: KubeFake) -> None:
    """Defect 3. volcano job_controller_util.go applyPolicies: the job's policies in order,
    the first match wins, and a failed pod's request carries both PodFailed and its exit
    code: PodFailed -> RestartJob listed before exitCode 76 -> TerminateJob shadows it."""
    name = submit(fake, gang())
    fake.volcano.pods_running(NS, name)
    fake.volcano.pod_failed(NS, name, index=1, exit_code=76)
    fake.pods.finish_terminating(NS)
    status = fake.volcano.job(NS, name)["status"]
    assert status["state"]["phase"] == "Terminated" and status["retryCount"] == 0


@pytest.mark.parametrize("max_restarts", [0, 1, 2])
def test_volcano_max_restarts_means_restarts(fake: KubeFake, max_restarts: int) -> None:
    """Defect 4. volcano state/running.go and restarting.go: the job fails when a restart
    finds retryCount at maxRetry, so maxRetry N allows N-1 restarts
    (test/e2e/jobp/job_restart.go); and mutate_job.go turns maxRetry 0 into 3."""
    name = submit(fake, gang(max_restarts=max_restarts))
    failures = 0
    while fake.volcano.phase(NS, name) != "Failed":
        assert failures <= max_restarts, "the gang restarted more often than max_restarts"
        fake.volcano.pods_running(NS, name)
        fake.volcano.pod_failed(NS, name, exit_code=1)  # a crash: PodFailed -> RestartJob
        fake.pods.finish_terminating(NS)
        failures += 1
    assert fake.volcano.restarts.get((NS, name), 0) == max_restarts


def test_volcano_queues_manifest_is_admitted() -> None:
    """Defect 5: volcano validate_queue.go validateSiblingsSum refuses a child queue's
    deserved under a parent without deserved (the sum exceeds the parent's zero limit), and
    validateResourceQuantityOfQueue a parent's deserved above its capability. The parent
    holds the teams' deserved summed, within the capability the broker moves."""
    with KubeFake() as fake:
        created = fake.apply(DEPLOY / "volcano-queues.yaml")
    assert {q["metadata"]["name"] for q in created} == {"training", "vision", "nlp"}
    spec = {q["metadata"]["name"]: q["spec"] for q in created}
    teams = sum(int(spec[t]["deserved"]["nvidia.com/gpu"]) for t in ("vision", "nlp"))
    assert teams == int(spec["training"]["deserved"]["nvidia.com/gpu"])
    assert teams <= int(spec["training"]["capability"]["nvidia.com/gpu"])


def test_preemption_does_not_consume_restarts_volcano(fake: KubeFake) -> None:
    """Defect 8 (Volcano). Every action that starts a Volcano Job's pods again adds to
    status.retryCount, which maxRetry bounds: RestartJob (state/running.go) and ResumeJob
    after an abort (state/aborting.go). A preempted gang is aborted instead (its worker
    exits 75 after the checkpoint: the first policy that matches, job_controller_util.go
    applyPolicies), and the next submit replaces the aborted Job with one that allows the
    restarts still left. Three preemptions around one real failure leave max_restarts - 1."""
    worker = KubernetesBackend(fake.client(WORKER), VOLCANO)
    broker = KubernetesBackend(fake.client(BROKER), VOLCANO)
    job = gang(max_restarts=2)
    name = submit(fake, job)
    for round_ in range(3):
        fake.volcano.pods_running(NS, name)
        if round_ == 1:  # a real failure in the middle: that one counts
            fake.volcano.pod_failed(NS, name, exit_code=1)
            fake.pods.finish_terminating(NS)
            fake.volcano.pods_running(NS, name)
        broker.preempt(job.gang_id)
        fake.pods.finish_terminating(NS)
        assert fake.volcano.phase(NS, name) == "Aborted"
        preempted = worker.status(job.gang_id)
        assert preempted is not None and preempted.state is GangState.PREEMPTED
        resumed = worker.submit(job)  # what the operator does on PREEMPTED
        assert resumed.state is GangState.PENDING
        assert fake.volcano.phase(NS, name) == "Pending"
        assert fake.volcano.job(NS, name)["status"].get("retryCount", 0) == 0
    assert resumed.restarts == 1  # the one real failure, not the three preemptions
    spec = fake.volcano.job(NS, name)["spec"]
    assert spec["maxRetry"] == 2  # one restart left, as Volcano counts
    jobs = fake.list("batch.volcano.sh/v1alpha1", "Job", NS)
    assert [j["metadata"]["name"] for j in jobs] == [name]  # one gang, never two


def test_a_worker_killed_by_sigterm_is_preempted_not_failed_volcano(fake: KubeFake) -> None:
    """A plain training script has no SIGTERM handler: an evicted worker dies of the signal
    (exit 143) before its pod is gone. That is a stop from outside, not a crash."""
    fake.pods.termination_exit_code = 143
    job = gang(max_restarts=0)
    name = submit(fake, job)
    fake.volcano.pods_running(NS, name)
    KubernetesBackend(fake.client(BROKER), VOLCANO).preempt(job.gang_id)
    fake.pods.finish_terminating(NS)
    status = KubernetesBackend(fake.client(WORKER), VOLCANO).status(job.gang_id)
    assert status is not None and status.state is GangState.PREEMPTED


def test_preemption_does_not_consume_restarts_jobset(fake: KubeFake) -> None:
    """Defect 8 (JobSet). An evicted worker fails with the DisruptionTarget condition; unless
    a pod failure policy rule and a RestartJobSetAndIgnoreMaxRestarts failure-policy rule
    catch it, the Job fails with BackoffLimitExceeded and the default RestartJobSet counts
    towards maxRestarts (jobset failure_policy.md, host-maintenance-event-model.yaml)."""
    job = gang("nlp-train/manual__2026-11-23T12:00:00+00:00/train")
    job = GangJob(**{**job.__dict__, "team": "nlp"})
    name = submit(fake, job, KUEUE)
    fake.kueue.admit(NS, name)
    fake.jobset.pods_running(NS, name)
    KubernetesBackend(fake.client(BROKER), KUEUE).preempt(job.gang_id)
    fake.pods.finish_terminating(NS)
    status = fake.jobset.jobset(NS, name)["status"]
    assert status["restarts"] == 1 and status.get("restartsCountTowardsMax", 0) == 0


# -- what tideflow relies on besides --------------------------------------------------------


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]
    }


def test_volcano_master_addr_is_worker_0s_host_name_and_ranks_come_from_the_env_plugin(
    fake: KubeFake,
) -> None:
    """svc plugin: host name <job>-worker-<i> under the headless Service <job>; env plugin:
    VC_TASK_INDEX (tideflow.runtime.distributed reads it as the rank)."""
    name = submit(fake, gang())
    first = fake.volcano.pod(NS, name, index=0)
    assert (
        env_of(first)["MASTER_ADDR"] == f"{first['spec']['hostname']}.{first['spec']['subdomain']}"
    )
    assert fake.get("v1", "Service", first["spec"]["subdomain"])["spec"]["clusterIP"] == "None"
    ranks = [env_of(fake.volcano.pod(NS, name, index=i))["VC_TASK_INDEX"] for i in range(4)]
    assert ranks == ["0", "1", "2", "3"]


def test_jobset_master_addr_is_worker_0s_host_name_and_ranks_are_completion_indexes(
    fake: KubeFake,
) -> None:
    job = GangJob(**{**gang().__dict__, "team": "nlp"})
    name = submit(fake, job, KUEUE)
    fake.kueue.admit(NS, name)
    first = fake.jobset.pod(NS, name, index=0)
    assert (
        env_of(first)["MASTER_ADDR"] == f"{first['spec']['hostname']}.{first['spec']['subdomain']}"
    )
    assert fake.get("v1", "Service", first["spec"]["subdomain"])["spec"]["clusterIP"] == "None"
    assert "JOB_COMPLETION_INDEX" in env_of(first)
    # Kueue put the pods on the flavor tideflow asked for, and tolerated the pool taint
    assert first["spec"]["nodeSelector"]["tideflow.io/pool"] == "training"


def test_the_airflow_identities_hold_exactly_what_the_gang_path_uses(fake: KubeFake) -> None:
    """deploy/kubernetes/airflow-rbac.yaml: the worker gets and creates (and replaces a
    preempted or failed gang: delete), the triggerer lists, watches and deletes, for both kinds
    of gang object, and nothing is left unused."""
    for settings, team in ((VOLCANO, "vision"), (KUEUE, "nlp")):
        job = GangJob(**{**gang(f"{team}/run/train").__dict__, "team": team})
        name = submit(fake, job, settings)

        def start(info: Any, settings: KubeSettings = settings, name: str = name) -> None:
            if settings.gang_scheduler == "kueue":
                fake.kueue.admit(NS, name)
                fake.jobset.pods_running(NS, name)
            else:
                fake.volcano.pods_running(NS, name)

        fake.when_watched(start)

        async def follow_until_running(
            settings: KubeSettings = settings, job: GangJob = job
        ) -> list[Any]:
            from kubernetes_asyncio import client

            seen = []
            async with client.ApiClient(fake.async_configuration(TRIGGERER)) as api:
                async for status in follow(api, settings, job.gang_id, timeout_s=5):
                    seen.append(status.state)
                    if status.state is GangState.RUNNING:
                        break
            return seen

        seen = asyncio.run(follow_until_running())
        assert seen[0] is GangState.PENDING and seen[-1] is GangState.RUNNING
        if settings.gang_scheduler == "volcano":  # preempted, then resumed by the worker
            KubernetesBackend(fake.client(BROKER), settings).preempt(job.gang_id)
            fake.pods.finish_terminating(NS)
        else:  # failed, then replaced by the task's retry
            fake.jobset.pod_failed(NS, name, exit_code=76)
        resumed = KubernetesBackend(fake.client(WORKER), settings).submit(job)
        assert resumed.state is GangState.PENDING
        KubernetesBackend(fake.client(TRIGGERER), settings).cancel(job.gang_id)
    assert all(r.code < 400 or r.verb == "get" for r in fake.requests_by(WORKER))
    assert all(r.code < 400 for r in fake.requests_by(TRIGGERER))
    assert fake.rbac.unused(WORKER, NS) == set()
    assert fake.rbac.unused(TRIGGERER, NS) == set()
