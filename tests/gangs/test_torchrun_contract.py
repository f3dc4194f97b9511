"""An unmodified torchrun script runs as a tideflow gang, on every backend.

The script (tests/user_code/plain_ddp.py) is written as a team writes one for
``torchrun``: ``init_process_group("gloo")`` with ``env://``, ``LOCAL_RANK``
from the environment, ``DistributedSampler``. Each test compares what tideflow
gives it with what torchrun itself gives it (torch's own launcher, run here):
the same torchrun variables are set, the ranks agree, and training ends in
bitwise the same weights.

Local: the local backend's real worker processes. Volcano and JobSet: the
objects the Kubernetes backend submits go through the one Kubernetes fake
(tests/kubefake: no API server, Volcano, JobSet or Kueue runs here), whose
controllers make the pods; each pod's environment is resolved as the kubelet
would (plain values, downward-API fields from the pod), and its container runs
here as a process, with ``MASTER_ADDR`` pointed at this machine (the fake has no
DNS). The Argo gang step submits through the same backend
(tests/pipelines/test_argo_gang_step.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kubefake import DEPLOY, KubeFake, service_account
from tests.kubefake.pods import container_environment
from tideflow.backends import GangJob, GangState, WorkerSlot
from tideflow.backends.kubernetes import KubernetesBackend
from tideflow.backends.local import LocalBackend
from tideflow.kube import KubeSettings

pytestmark = pytest.mark.processes

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "user_code" / "plain_ddp.py"
ARGS = ("--epochs", "2", "--seed", "3")
NS = "tideflow"
WORKER = service_account(NS, "tideflow-airflow-worker")
# What torchrun sets for every worker (torch distributed/elastic/agent/server/
# local_elastic_agent.py _start_workers), and the values that must agree for 2 workers
# of one node or of two one-worker pods.
RANK_VARIABLES = ("RANK", "ROLE_RANK", "WORLD_SIZE", "ROLE_WORLD_SIZE", "ROLE_NAME")


def reports(out: Path) -> dict[int, dict[str, Any]]:
    return {
        int(path.stem.split("-")[1]): json.loads(path.read_text())
        for path in sorted(out.glob("rank-*.json"))
    }


@pytest.fixture(scope="module")
def torchrun(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    """The script under torch's own launcher: 2 workers on this machine."""
    out = tmp_path_factory.mktemp("torchrun")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            str(SCRIPT),
            *ARGS,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = reports(out)
    assert sorted(found) == [0, 1]
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def assert_same_contract(
    ours: dict[int, dict[str, Any]], theirs: dict[int, dict[str, Any]]
) -> None:
    assert sorted(ours) == sorted(theirs) == [0, 1]
    for rank in (0, 1):
        mine, torch_ = ours[rank]["environment"], theirs[rank]["environment"]
        unset = sorted(name for name, value in mine.items() if value in (None, ""))
        assert unset == [], f"rank {rank}: torchrun sets {unset}, tideflow did not"
        assert set(mine) == set(torch_)
        for name in RANK_VARIABLES:
            assert mine[name] == torch_[name], (rank, name)
        assert int(mine["LOCAL_RANK"]) < int(mine["LOCAL_WORLD_SIZE"])
        assert int(mine["GROUP_RANK"]) < int(mine["GROUP_WORLD_SIZE"])
    # one DDP gang: the ranks ended equal, and equal to torchrun's run, bit for bit
    assert ours[0]["weights"] == ours[1]["weights"] == theirs[0]["weights"]


def test_an_unmodified_torchrun_script_runs_as_a_local_gang(
    tmp_path: Path, torchrun: dict[int, dict[str, Any]]
) -> None:
    out = tmp_path / "out"
    backend = LocalBackend(tmp_path / "gangs")
    job = GangJob(
        gang_id="plain/run-1/train",
        command=(sys.executable, str(SCRIPT), *ARGS, "--out", str(out)),
        env={},
        slots=tuple(WorkerSlot(rank, "localhost", ()) for rank in range(2)),
        device_class="cpu",
        emulated=False,
        max_restarts=1,
    )
    backend.submit(job)
    status = backend.wait(job.gang_id, 120)
    assert status.state is GangState.SUCCEEDED, backend.log_path(job.gang_id).read_text()[-3000:]
    ours = reports(out)
    # two workers on one machine: one thread each, as torchrun sets OMP_NUM_THREADS
    assert [ours[r]["threads"] for r in (0, 1)] == [torchrun[r]["threads"] for r in (0, 1)]
    assert_same_contract(ours, torchrun)
    environment = ours[1]["environment"]
    assert environment["LOCAL_RANK"] == "1" and environment["LOCAL_WORLD_SIZE"] == "2"
    assert environment["TORCHELASTIC_RUN_ID"] == "plain/run-1/train"
    assert environment["TORCHELASTIC_MAX_RESTARTS"] == "1"
    assert environment["TORCHELASTIC_RESTART_COUNT"] == "0"


@pytest.fixture
def fake() -> Iterator[KubeFake]:
    with KubeFake() as cluster:
        cluster.apply(DEPLOY / "priority-classes.yaml", DEPLOY / "kueue-queues.yaml")
        cluster.seed(DEPLOY / "volcano-queues.yaml")
        yield cluster


def run_pods(pods: list[dict[str, Any]], out: Path) -> dict[int, dict[str, Any]]:
    """Each pod's one container, run here with the environment the kubelet would give it."""
    port = str(free_port())
    running = []
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        env = container_environment(pod)
        assert env["MASTER_PORT"]  # the gang's rendezvous port; this machine's is free
        env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        command = [sys.executable, *container["command"][1:]]
        running.append(
            subprocess.Popen(
                [*command, "--out", str(out)],
                env={**os.environ, **env},
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    for process in running:
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, output[-3000:]
    return reports(out)


@pytest.mark.parametrize("scheduler", ["volcano", "kueue"])
def test_gang_pods_give_an_unmodified_torchrun_script_its_environment(
    fake: KubeFake, tmp_path: Path, torchrun: dict[int, dict[str, Any]], scheduler: str
) -> None:
    settings = KubeSettings(namespace=NS, gang_scheduler=scheduler)
    backend = KubernetesBackend(fake.client(WORKER), settings)
    job = GangJob(
        gang_id="plain/run-2/train",
        command=("python", str(SCRIPT), *ARGS),
        env={},
        slots=tuple(WorkerSlot(rank, "", ()) for rank in range(2)),
        device_class="cpu",
        emulated=False,
        max_restarts=2,
        team="vision",
    )
    backend.submit(job)
    name = backend.job_name(job.gang_id)
    if scheduler == "volcano":
        fake.volcano.pods_running(NS, name)
        pods = fake.volcano.pods(fake.volcano.job(NS, name))
    else:
        fake.kueue.admit(NS, name)
        fake.jobset.pods_running(NS, name)
        pods = [fake.jobset.pod(NS, name, index=index) for index in range(2)]
    assert len(pods) == 2
    ours = run_pods(pods, tmp_path / "out")
    assert_same_contract(ours, torchrun)
    for rank, report in ours.items():
        environment = report["environment"]
        assert environment["GROUP_RANK"] == str(rank)  # one worker per pod: a pod is a group
        assert environment["LOCAL_RANK"] == "0" and environment["LOCAL_WORLD_SIZE"] == "1"
        assert environment["TORCHELASTIC_RUN_ID"] == "plain/run-2/train"
        assert environment["TORCHELASTIC_MAX_RESTARTS"] == "2"
        assert environment["TORCHELASTIC_RESTART_COUNT"] == "0"
