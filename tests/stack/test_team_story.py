"""The demo's teams story (``tideflow.stack.team_story``) when the lender takes its GPU
back at the very next broker run.

Real digits ranks on emulated GPUs (this machine has none) and the lab's real lease
ledger. The broker's DAG runs are stood in for by ``step_broker``: it reserves
inference's GPUs in the ledger as the broker's actuator does, and preempts the gang the
ledger evicts, as the actuator does when it carries an eviction out.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tideflow.stack.team_story import GANG_ID, LAB_CLUSTER, run_team_story

pytestmark = pytest.mark.processes


@pytest.mark.timeout(300)
def test_a_gang_reclaimed_at_the_next_broker_run_checkpoints_on_notice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tideflow.backends.local import LocalBackend
    from tideflow.broker.local import INFERENCE_PREFIX
    from tideflow.broker.tenant import INFERENCE_PRIORITY, INFERENCE_TEAM
    from tideflow.gangs import open_ledger
    from tideflow.scheduling import GangRequest, Lease

    monkeypatch.setenv("TIDEFLOW_CLUSTER_FILE", str(LAB_CLUSTER))  # the supervisor's ledger
    ledger = open_ledger(tmp_path / "leases.db", str(LAB_CLUSTER))
    runs: list[str] = []

    def reserve(index: int) -> Lease | object:
        request = GangRequest(
            f"{INFERENCE_PREFIX}{index}", INFERENCE_TEAM, "gpu", None, 1, 1,
            INFERENCE_PRIORITY, preemptible=False,
        )  # fmt: skip
        return ledger.try_acquire(request, "broker", 600)

    def step_broker() -> str:
        runs.append("success")
        if len(runs) == 1:  # the trough: inference holds 3 GPUs of its quota of 4
            assert all(isinstance(reserve(index), Lease) for index in range(3))
        else:  # the load climbs at once: inference takes its fourth GPU back
            assert not isinstance(reserve(3), Lease)  # vision's gang holds it: evicted
            LocalBackend(tmp_path / "gangs").preempt(GANG_ID)
        return runs[-1]

    result = run_team_story(tmp_path, step_broker, timeout_s=240, say=print)

    assert result.borrowed == 1 and result.broker_runs == 2
    assert "reclaimed by its lender inference" in result.evicted
    assert result.checkpoint_step is not None and result.told  # it had trained: nothing lost
