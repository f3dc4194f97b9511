"""The compiled Argo gang step, run as Argo runs it, against the one Kubernetes fake.

No Argo controller, API server or Volcano controller can run here: the step's
container (tideflow's gang driver) runs as a child process with Argo's
variables filled in (tests/argo_run.py) and its ServiceAccount's token for
tests/kubefake, which admits what it creates by upstream's rules and plays
Volcano. What Argo does to the step is done to the process as Argo documents it:

* ``activeDeadlineSeconds`` on a container template is set on its pod (argo
  docs/fields.md, Template.activeDeadlineSeconds: "the pod may be active on a
  node before the system actively tries to terminate the pod"; docs/walk-through/
  timeouts.md), and the kubelet terminates a pod with SIGTERM, then SIGKILL after
  its grace period; ``argo stop`` signals the main container the same way;
* a retry (``retryStrategy``) is a new pod of the same template with
  ``{{retries}}`` one higher (argo docs/retries.md).

Not covered: the fake serves no Argo Workflow objects, so the workflow's ownership
of the gang (deleting the workflow deletes it) is checked as the ownerReference alone.
"""

from __future__ import annotations

import signal
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.argo_run import REPO, defaults, start_gang_driver, templates, wait_for_gang
from tests.kubefake import KubeFake, gang_cluster
from tests.kubefake.object_meta import label_value_problems
from tests.kubefake.pods import container_environment
from tests.simulated_workers import commit_as_workers
from tests.user_code.plain_ddp import TORCHRUN_VARIABLES
from tideflow.argo import compile_pipeline
from tideflow.kube import KubeSettings

pytestmark = pytest.mark.processes

NS = "tideflow"
JOBS = ("batch.volcano.sh/v1alpha1", "Job")


@pytest.fixture
def fake() -> Iterator[KubeFake]:
    with gang_cluster() as cluster:
        yield cluster


def settings(tmp_path: Path) -> KubeSettings:
    return KubeSettings(namespace=NS, artifact_root=(tmp_path / "artifacts").as_uri())


def digits(tmp_path: Path) -> dict[str, Any]:
    text = compile_pipeline(REPO / "pipelines" / "digits.yaml", settings=settings(tmp_path))[1]
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


def scope(workflow: dict[str, Any], name: str, retries: int = 0, **params: Any) -> dict[str, str]:
    """Argo's variables for the gang step of workflow run ``name``, attempt ``retries``."""
    train = templates(workflow)["train"]
    values = {
        "workflow.name": name,
        "workflow.uid": f"uid-{name}",
        "retries": str(retries),
        **defaults(workflow, **params),
    }
    for parameter in train["inputs"]["parameters"]:
        values[f"inputs.parameters.{parameter['name']}"] = f"file:///data/{parameter['name']}"
    return values


def test_a_timed_out_gang_step_leaves_no_gang(fake: KubeFake, tmp_path: Path) -> None:
    """Defect 7: a resource template's deadline ended Argo's own pod and left the Volcano
    Job running. The driver is the step's pod: SIGTERM (its deadline) deletes the gang."""
    workflow = digits(tmp_path)
    train = templates(workflow)["train"]
    assert train["activeDeadlineSeconds"] == 1800  # the step's timeout, on the driver's pod
    driver = start_gang_driver(train, scope(workflow, "digits-a1b2c"), tmp_path / "a", {}, fake)
    name = wait_for_gang(fake, NS, driver)
    fake.volcano.pods_running(NS, name)
    driver.send_signal(signal.SIGTERM)
    out, _ = driver.communicate(timeout=30)
    assert driver.returncode == 143, out
    assert "deleted" in out
    assert fake.list(*JOBS, NS) == []


def test_a_retried_gang_step_follows_the_gang_it_made_and_never_starts_a_second(
    fake: KubeFake, tmp_path: Path
) -> None:
    """Defect 7: with retries, each attempt of a resource template created its own Job
    (`...-{{retries}}`), so a second gang trained beside the first on the same store.
    An attempt killed without its grace (SIGKILL) leaves its gang; the retry follows it."""
    workflow = digits(tmp_path)
    train = templates(workflow)["train"]
    assert train["retryStrategy"]["limit"] == 1
    first = start_gang_driver(train, scope(workflow, "digits-d3e4f"), tmp_path / "1", {}, fake)
    name = wait_for_gang(fake, NS, first)
    fake.volcano.pods_running(NS, name)
    first.kill()
    first.communicate(timeout=30)
    retry = start_gang_driver(
        train, scope(workflow, "digits-d3e4f", retries=1), tmp_path / "2", {}, fake
    )
    try:
        assert wait_for_gang(fake, NS, retry) == name
        commit_as_workers(fake.get(*JOBS, name, NS))
        fake.volcano.pods_succeeded(NS, name)
        out, _ = retry.communicate(timeout=60)
    finally:
        retry.kill()
    assert retry.returncode == 0, out
    (job,) = fake.list(*JOBS, NS)
    assert job["metadata"]["uid"] and job["metadata"]["name"] == name
    assert job["metadata"]["ownerReferences"][0]["name"] == "digits-d3e4f"
    store = (tmp_path / "2" / "checkpoint_store").read_text()
    assert store == f"{(tmp_path / 'artifacts').as_uri()}/digits/digits-d3e4f/train/checkpoints"


def test_a_retry_after_a_failed_gang_replaces_it(fake: KubeFake, tmp_path: Path) -> None:
    """The first attempt's gang failed (exit 76: unhealthy, no restarts); the retry
    deletes it and starts one fresh gang under the same name, as an Airflow retry does."""
    workflow = digits(tmp_path)
    train = templates(workflow)["train"]
    first = start_gang_driver(train, scope(workflow, "digits-g5h6i"), tmp_path / "1", {}, fake)
    name = wait_for_gang(fake, NS, first)
    fake.volcano.pods_running(NS, name)
    fake.volcano.pod_failed(NS, name, exit_code=76)
    fake.pods.finish_terminating(NS)
    out, _ = first.communicate(timeout=60)
    assert first.returncode == 1, out
    failed_uid = fake.get(*JOBS, name)["metadata"]["uid"]
    retry = start_gang_driver(
        train, scope(workflow, "digits-g5h6i", retries=1), tmp_path / "2", {}, fake
    )
    try:
        _wait_for_replacement(fake, name, failed_uid)
    finally:
        retry.send_signal(signal.SIGTERM)
        retry.communicate(timeout=30)


def _wait_for_replacement(fake: KubeFake, name: str, old_uid: str) -> None:
    """Until one Job named ``name`` with a new uid exists; never two at once."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        jobs = fake.list(*JOBS, NS)
        assert len(jobs) <= 1, "two gangs at once"
        if jobs and jobs[0]["metadata"]["uid"] != old_uid:
            assert jobs[0]["metadata"]["name"] == name
            return
        time.sleep(0.1)
    raise AssertionError("the retry did not replace the failed gang within 60 s")


LONG = "a-pipeline-name-of-forty-characters-xyzw"  # 40, the longest the spec allows
LONG_STEP = "a-step-name-also-of-forty-characters-xyz"  # 40


def test_the_longest_names_give_labels_and_hostnames_kubernetes_accepts(
    fake: KubeFake, tmp_path: Path
) -> None:
    """Defect 9a: `{{workflow.name}}-<step>-{{retries}}` made the Job's name, its pods'
    hostnames and its `tideflow.io/gang` label; past about 40 + 40 characters, over 63.
    The fake admits every object by the API server's ObjectMeta rules
    (tests/kubefake/object_meta.py), and its Volcano controller creates the pods."""
    assert len(LONG) == 40 and len(LONG_STEP) == 40
    path = tmp_path / "long.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            apiVersion: tideflow/v1
            kind: Pipeline
            metadata: {{name: {LONG}, team: vision}}
            steps:
              - name: {LONG_STEP}
                retries: 2
                gang_training:
                  entrypoint: [python, -m, my.train]
                  workers: 12
            """
        )
    )
    workflow = yaml.safe_load(compile_pipeline(path, settings=settings(tmp_path))[1])
    step = templates(workflow)[LONG_STEP]
    run = f"{LONG}-q7x2k"  # Argo's generateName: the template's name and five characters
    values = {"workflow.name": run, "workflow.uid": "uid-1", "retries": "2"}
    driver = start_gang_driver(step, values, tmp_path / "out", {}, fake)
    try:
        name = wait_for_gang(fake, NS, driver)
        fake.volcano.pods_running(NS, name)
        job = fake.get(*JOBS, name)
        pods = fake.volcano.pods(job)
        assert len(pods) == 12
        for obj in (job, *pods):
            for value in obj["metadata"]["labels"].values():
                assert label_value_problems(value) == [], value
        ranks = set()
        for pod in pods:
            assert len(pod["spec"].get("hostname") or pod["metadata"]["name"]) <= 63
            # torchrun's environment as the kubelet resolves it
            # (tests/gangs/test_torchrun_contract.py)
            env = container_environment(pod)
            assert all(env.get(name) for name in TORCHRUN_VARIABLES), pod["metadata"]["name"]
            assert env["WORLD_SIZE"] == "12" and env["LOCAL_RANK"] == "0"
            ranks.add(int(env["RANK"]))
        assert ranks == set(range(12))
    finally:
        driver.send_signal(signal.SIGTERM)
        driver.communicate(timeout=30)
    assert fake.list(*JOBS, NS) == []
