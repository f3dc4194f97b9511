"""The Argo gang step's driver (``tideflow.gangs.driver``) against the one Kubernetes fake.

No API server or Volcano controller can run here (tests/kubefake plays them). The
driver runs as the ServiceAccount deploy/kubernetes/argo-rbac.yaml gives it, so
its RBAC must allow exactly what it calls. Argo's side (the container template
that runs it, its deadline's SIGTERM) is the compiler's and Argo's; here the
signal is the ``stop`` event the driver's SIGTERM handler sets.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kubefake import KubeFake, gang_cluster, service_account
from tests.simulated_workers import commit_as_workers
from tideflow.backends.kubernetes import KubernetesBackend
from tideflow.backends.protocol import GangState
from tideflow.compile.gang_plan import gang_plan_from_json
from tideflow.gangs import ResolvedGang, resolve_gang
from tideflow.gangs.driver import StoppedError, drive, main
from tideflow.kube import KubeSettings
from tideflow.kube.names import gang_object_name
from tideflow.kube.settings import settings_to_json

NS = "tideflow"
DRIVER = service_account(NS, "tideflow-argo-gang-driver")
BROKER = service_account(NS, "tideflow-broker")
SETTINGS = KubeSettings(namespace=NS)
CONFIG = {
    "entrypoint": ["python", "-m", "vision.train"],
    "workers": 2,
    "devices_per_worker": 1,
    "device": {"class": "gpu", "model": "H100"},
    "max_restarts": 1,
    "checkpoint": {"keep_last": 2},
}


@pytest.fixture
def fake() -> Iterator[KubeFake]:
    with gang_cluster() as cluster:
        yield cluster


def argv(
    tmp_path: Path,
    run_id: str = "vision-train-x7k2p",
    *,
    config: dict[str, object] | None = None,
    roots: str = "",
    **extra: str,
) -> list[str]:
    settings = KubeSettings(
        namespace=NS, artifact_root=(tmp_path / "artifacts").as_uri(), checkpoint_roots=roots
    )
    args = [
        "gang_training",
        "--pipeline",
        "vision-train",
        "--team",
        "vision",
        "--step",
        "train",
        "--run-id",
        run_id,
        "--config",
        json.dumps({**CONFIG, "workers": 1, **(config or {})}),
        "--set",
        "workers:int=2",  # as Argo fills in {{workflow.parameters.workers}}
        "--kube-settings",
        settings_to_json(settings),
        "--outputs",
        str(tmp_path / "outputs"),
    ]
    for key, value in extra.items():
        args += [f"--{key.replace('_', '-')}", value]
    return args


def resolved(run_id: str, artifact_root: str = "s3://tideflow/artifacts") -> ResolvedGang:
    """The gang step of CONFIG in run ``run_id``, as the operator and the driver resolve it."""
    return resolve_gang(
        gang_plan_from_json(CONFIG),
        pipeline="vision-train",
        team="vision",
        run_id=run_id,
        step="train",
        artifact_root=artifact_root,
        allowed_roots=(),
    )


def job_name(run_id: str = "vision-train-x7k2p") -> str:
    return gang_object_name(f"vision-train/{run_id}/train", "volcano")


def when_created(fake: KubeFake, then: object, name: str) -> threading.Thread:
    """Run ``then(name)`` from another thread once the driver has created the Job."""

    def wait() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if fake.get("batch.volcano.sh/v1alpha1", "Job", name) is not None:
                then(name)  # type: ignore[operator]
                return
            time.sleep(0.05)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def test_the_driver_creates_one_owned_gang_follows_it_and_reports_its_store(
    fake: KubeFake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tideflow.gangs.driver.POLL_S", 0.05)

    def succeed(name: str) -> None:
        fake.volcano.pods_running(NS, name)
        commit_as_workers(fake.get("batch.volcano.sh/v1alpha1", "Job", name, NS))
        fake.volcano.pods_succeeded(NS, name)

    watcher = when_created(fake, succeed, job_name())
    code = main(
        argv(tmp_path, owner_name="vision-train-x7k2p", owner_uid="0f9c-uid"),
        api_client=fake.client(DRIVER),
    )
    watcher.join(5)
    assert code == 0
    (job,) = fake.list("batch.volcano.sh/v1alpha1", "Job", NS)
    assert job["spec"]["minAvailable"] == 2  # the size Argo filled in
    assert job["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Workflow",
            "name": "vision-train-x7k2p",
            "uid": "0f9c-uid",
            "blockOwnerDeletion": False,
        }
    ]
    expected = resolved("vision-train-x7k2p", (tmp_path / "artifacts").as_uri())
    outputs = tmp_path / "outputs"
    assert (outputs / "checkpoint_store").read_text() == expected.store  # the operator's rule
    env = {
        e["name"]: e.get("value")
        for e in job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["TIDEFLOW_CHECKPOINT_URI"] == expected.store
    assert env["TIDEFLOW_RUN_ID"] == "vision-train-x7k2p" and env["WORLD_SIZE"] == "2"


def test_a_stopped_step_deletes_its_gang_and_a_retry_finds_none_or_the_running_one(
    fake: KubeFake,
) -> None:
    """Defect 7. Argo's activeDeadlineSeconds ends only the step's own pod (argo
    docs/walk-through/kubernetes-resources.md; the template schema's description), so a
    gang the step created must be deleted by the step: a timed-out step leaves none, and a
    retried one reattaches to a gang that still runs instead of starting a second."""
    gang = resolved("wf-1")
    job = gang.cluster_job()
    backend = KubernetesBackend(fake.client(DRIVER), SETTINGS)
    stop = threading.Event()
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(drive(backend, job, stop=stop, say=lambda _: None, poll_s=0.05))
        except StoppedError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    name = job_name("wf-1")
    deadline = time.monotonic() + 10
    while fake.get("batch.volcano.sh/v1alpha1", "Job", name) is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    fake.volcano.pods_running(NS, name)
    stop.set()  # SIGTERM: the step's deadline passed
    thread.join(10)
    assert isinstance(outcome[0], StoppedError)
    assert fake.list("batch.volcano.sh/v1alpha1", "Job", NS) == []  # no gang left
    # a driver killed without its grace leaves the gang; the retry follows that one
    backend.submit(job)
    fake.volcano.pods_running(NS, name)
    retry = KubernetesBackend(fake.client(DRIVER), SETTINGS).submit(job)
    assert retry.state is GangState.RUNNING
    assert len(fake.list("batch.volcano.sh/v1alpha1", "Job", NS)) == 1


def test_the_driver_resubmits_a_preempted_gang_with_its_restarts(fake: KubeFake) -> None:
    gang = resolved("wf-2")
    job = gang.cluster_job()
    name = job_name("wf-2")
    broker = KubernetesBackend(fake.client(BROKER), SETTINGS)
    moves = iter(["preempt", "finish"])

    def step(_: str) -> None:
        move = next(moves)
        fake.volcano.pods_running(NS, name)
        if move == "preempt":
            broker.preempt(job.gang_id)
            fake.pods.finish_terminating(NS)
        else:
            fake.volcano.pods_succeeded(NS, name)

    class Backend(KubernetesBackend):
        def submit(self, submitted):  # type: ignore[no-untyped-def]
            status = super().submit(submitted)
            threading.Thread(target=step, args=(name,), daemon=True).start()
            return status

    status = drive(
        Backend(fake.client(DRIVER), SETTINGS),
        job,
        stop=threading.Event(),
        poll_s=0.05,
        say=lambda _: None,
    )
    assert status.state is GangState.SUCCEEDED and status.restarts == 0
    (final,) = fake.list("batch.volcano.sh/v1alpha1", "Job", NS)
    assert final["spec"]["maxRetry"] == 2  # its one restart still allowed
    # every Volcano grant of the driver's Role was used; only the JobSet ones were not
    assert {grant.group for grant in fake.rbac.unused(DRIVER, NS)} == {"jobset.x-k8s.io"}


def test_a_checkpoint_store_outside_the_teams_roots_is_refused_before_any_gang(
    fake: KubeFake,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The roots come with the settings (TIDEFLOW_CHECKPOINT_ROOTS where the workflow
    was compiled), as the operator checks them on Airflow."""
    monkeypatch.setattr("tideflow.gangs.driver.POLL_S", 0.05)
    other = (tmp_path / "other-team").as_uri()
    elsewhere = {"checkpoint": {"keep_last": 2, "store": other}}
    code = main(argv(tmp_path, config=elsewhere), api_client=fake.client(DRIVER))
    assert code == 2
    assert "outside the roots team 'vision' may write" in capsys.readouterr().err
    assert fake.list("batch.volcano.sh/v1alpha1", "Job", NS) == []

    def succeed(name: str) -> None:
        fake.volcano.pods_running(NS, name)
        commit_as_workers(fake.get("batch.volcano.sh/v1alpha1", "Job", name, NS))
        fake.volcano.pods_succeeded(NS, name)

    watcher = when_created(fake, succeed, job_name())
    declared = argv(tmp_path, config=elsewhere, roots=f"vision={other}")
    assert main(declared, api_client=fake.client(DRIVER)) == 0
    watcher.join(5)
    store = (tmp_path / "outputs" / "checkpoint_store").read_text()
    assert store == f"{other}/vision-train/vision-train-x7k2p/train/checkpoints"


def test_a_gang_that_committed_no_checkpoint_fails_the_step_saying_what_to_call(
    fake: KubeFake,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The step declares a checkpoint policy; its script never saved through tideflow."""
    monkeypatch.setattr("tideflow.gangs.driver.POLL_S", 0.05)

    def succeed_without_saving(name: str) -> None:
        fake.volcano.pods_running(NS, name)
        fake.volcano.pods_succeeded(NS, name)

    watcher = when_created(fake, succeed_without_saving, job_name())
    code = main(argv(tmp_path), api_client=fake.client(DRIVER))
    watcher.join(5)
    assert code == 1
    err = capsys.readouterr().err
    assert "committed no checkpoint" in err and "tideflow.checkpoints(" in err
    assert not (tmp_path / "outputs" / "checkpoint_store").exists()  # nothing downstream

    watcher = when_created(fake, succeed_without_saving, job_name("wf-optional"))
    optional = {"checkpoint": {"keep_last": 2, "optional": True}}
    assert main(argv(tmp_path, "wf-optional", config=optional), api_client=fake.client(DRIVER)) == 0
    watcher.join(5)
    assert "declared optional: going on" in capsys.readouterr().err
    assert (tmp_path / "outputs" / "checkpoint").read_text() == ""


def test_the_driver_polls_at_the_poll_interval_set_after_import(
    fake: KubeFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``POLL_S`` is read when the driver polls: set after import, it is the interval
    (the old code bound it as drive()'s default, so a changed value never reached it)."""
    monkeypatch.setattr("tideflow.gangs.driver.POLL_S", 0.05)
    polls: list[float] = []

    class CountingBackend(KubernetesBackend):
        def status(self, gang_id: str) -> Any:
            polls.append(time.monotonic())
            return super().status(gang_id)

    stop = threading.Event()

    timer = threading.Timer(1.0, stop.set)

    def submitted(_line: str) -> None:  # its first line: the gang was submitted
        if not timer.is_alive() and not stop.is_set():
            timer.start()

    backend = CountingBackend(fake.client(DRIVER), SETTINGS)
    with pytest.raises(StoppedError):
        drive(backend, resolved("wf-poll").cluster_job(), stop=stop, say=submitted)
    assert len(polls) >= 5  # a second at 0.05 s; none at the old 5 s
