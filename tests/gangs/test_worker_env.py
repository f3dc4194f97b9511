"""A local gang worker's environment as torchrun's launcher gives it
(torch/distributed/run.py): several workers on one node get one OpenMP thread
each, unless the user chose a number."""

from __future__ import annotations

import pytest

from tideflow.backends import GangJob, WorkerSlot
from tideflow.backends.worker_env import worker_env


def job(nodes: tuple[str, ...], env: dict[str, str] | None = None) -> GangJob:
    return GangJob(
        gang_id="digits/run/train",
        command=("python", "train.py"),
        env=env or {},
        slots=tuple(WorkerSlot(rank, node, ()) for rank, node in enumerate(nodes)),
        device_class="cpu",
        emulated=False,
        max_restarts=0,
    )


def test_workers_sharing_a_node_get_one_thread_each(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    gang = job(("localhost", "localhost"))
    assert [worker_env(gang, slot, 1234, 0)["OMP_NUM_THREADS"] for slot in gang.slots] == [
        "1",
        "1",
    ]


def test_a_worker_alone_on_its_node_keeps_torchs_own_thread_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    gang = job(("node-a", "node-b"))
    assert all("OMP_NUM_THREADS" not in worker_env(gang, s, 1234, 0) for s in gang.slots)


def test_a_thread_count_the_user_chose_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    gang = job(("localhost", "localhost"))
    assert worker_env(gang, gang.slots[0], 1234, 0)["OMP_NUM_THREADS"] == "3"
    monkeypatch.delenv("OMP_NUM_THREADS")
    stepped = job(("localhost", "localhost"), env={"OMP_NUM_THREADS": "4"})
    assert worker_env(stepped, stepped.slots[1], 1234, 0)["OMP_NUM_THREADS"] == "4"
