"""PyTorch Lightning with ``tideflow.integrations.lightning.TideflowCallback``, as real gangs.

The script under test is ``tests/user_code/lightning_train.py``: a small
classifier with dropout, SGD with momentum and a per-step LR schedule, trained
with ``strategy="ddp"`` on two gloo workers under torchrun's environment from
the local gang backend (Lightning detects TorchElastic and joins the gang).
Each interrupted run (a worker killed with SIGKILL mid-epoch, the gang
preempted with SIGTERM) is compared, bit for bit, with the same script run
without a checkpoint store (the callback then saves nothing), uninterrupted.
"""

from __future__ import annotations

import re
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from tests.framework_gangs import (
    Whole,
    gang,
    kill_rank,
    policy,
    preempt_and_wait,
    report,
    run,
    wait_for_checkpoint,
    wait_for_log,
    whole_run,
)
from tideflow.backends import GangState
from tideflow.backends.local import LocalBackend
from tideflow.checkpoint import CheckpointManager

# Found, not imported: importing Lightning takes seconds, and the tests run it in workers.
pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(
        find_spec("lightning") is None,
        reason="the Lightning integration needs lightning: pip install -e '.[lightning]'",
    ),
]

SCRIPT = Path(__file__).parents[1] / "user_code" / "lightning_train.py"
STEPS = 48  # 3 epochs x 512 samples / (16 per device x 2 ranks)
PER_EPOCH = 16


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The script without a checkpoint store, uninterrupted: the weights to match."""
    root = tmp_path_factory.mktemp("lightning-reference")
    run(LocalBackend(root / "gangs"), gang("reference", SCRIPT, root, {}))
    return report(root)


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory, mlflow_url: str) -> Whole:
    """The uninterrupted, checkpointed and tracked run two tests read."""
    root = tmp_path_factory.mktemp("lightning-whole")
    return whole_run(root, SCRIPT, mlflow_url, "lightning-integration")


@pytest.mark.timeout(240)  # the reference and the whole run start here
def test_an_uninterrupted_run_commits_lightning_checkpoints_and_trains_unchanged(
    whole: Whole, reference: dict[str, Any]
) -> None:
    assert report(whole.root) == reference  # neither the store nor MLflow changed training
    manager = CheckpointManager(whole.store)
    assert [m.step for m in manager.committed()] == [40, 45, STEPS]  # every 5, the end; keep 3
    final = manager.latest()
    assert final is not None
    assert final.meta == {"framework": "lightning", "world_size": 2}
    assert {s.name for s in final.shards} == {"checkpoint.ckpt", "rng-rank-0.pt", "rng-rank-1.pt"}
    assert final.metrics["loss"] > 0


# A gang's ranks import the framework (about 12 CPU-s each) at every start: a test
# that starts one twice took over 70 s of its old 90 s limit in the suite on two cores.
@pytest.mark.timeout(240)
def test_kill_9_of_rank_1_mid_epoch_resumes_from_the_committed_checkpoint_bitwise(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    store = (tmp_path / "ckpt").as_uri()
    backend = LocalBackend(tmp_path / "gangs")
    job = gang(
        "crash",
        SCRIPT,
        tmp_path,
        policy(store),
        extra=("--step-sleep", "0.1"),
        max_restarts=1,
    )
    backend.submit(job)
    reached = wait_for_checkpoint(store, 20)
    kill_rank(backend, "crash", 1)
    status = backend.wait("crash", 200)
    text = backend.log_path("crash").read_text()
    assert status.state is GangState.SUCCEEDED and status.restarts == 1, text[-4000:]
    found = re.search(r"resumed from checkpoint step (\d+) \(restart 1\)", text)
    assert found is not None, text[-4000:]
    resumed = int(found.group(1))
    assert 20 <= reached <= resumed < STEPS and resumed % 5 == 0
    assert f"relaunching; the newest committed checkpoint is step {resumed}" in text
    assert report(tmp_path) == reference
    if resumed % PER_EPOCH:  # mid-epoch: the data moved past the batches already trained on
        skipped = resumed % PER_EPOCH
        assert f"skipped the {skipped} batches of epoch {resumed // PER_EPOCH}" in text


@pytest.mark.timeout(240)
def test_sigterm_commits_exits_75_and_the_resubmitted_gang_resumes_bitwise(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    store = (tmp_path / "ckpt").as_uri()
    # every 1000 steps: the only checkpoint before the end is the one SIGTERM asks for
    env = policy(store, every_steps=1000)
    backend = LocalBackend(tmp_path / "gangs")
    backend.submit(gang("evict", SCRIPT, tmp_path, env, extra=("--step-sleep", "0.1")))
    wait_for_log(backend, "evict", r"epoch 0: train_loss")  # 16 steps in
    status, text = preempt_and_wait(backend, "evict")
    assert status.state is GangState.PREEMPTED and status.exit_codes == (75, 75), text[-4000:]
    committed = CheckpointManager(store).latest()
    assert committed is not None and PER_EPOCH <= committed.step < STEPS
    assert re.search(rf"rank 0: preempted \(SIGTERM\) at step {committed.step}; checkpoint ", text)
    assert re.search(rf"rank 1: preempted \(SIGTERM\) at step {committed.step}; ", text)

    run(backend, gang("evict", SCRIPT, tmp_path, env))  # the devices are back
    log = backend.log_path("evict").read_text()
    assert f"resumed from checkpoint step {committed.step} (restart 0)" in log
    assert report(tmp_path) == reference


@pytest.mark.timeout(240)
def test_the_guard_stops_a_diverging_run_with_exit_76_and_marks_the_last_good_checkpoint(
    tmp_path: Path,
) -> None:
    store = (tmp_path / "ckpt").as_uri()
    backend = LocalBackend(tmp_path / "gangs")
    backend.submit(gang("diverge", SCRIPT, tmp_path, policy(store, 1), extra=("--lr", "50")))
    status = backend.wait("diverge", 200)
    text = backend.log_path("diverge").read_text()
    assert status.state is GangState.FAILED and 76 in status.exit_codes, text[-4000:]
    assert "training-health guard stopped the run" in status.message
    stopped = re.search(
        r"guard stopped the run at step (\d+): .*last good checkpoint: step (\d+)", text
    )
    assert stopped is not None, text[-4000:]
    manager = CheckpointManager(store)
    newest = manager.latest()
    assert newest is not None and newest.step < int(stopped.group(1))  # the bad step unsaved
    assert manager.marked("last-good") == newest.step == int(stopped.group(2))


@pytest.mark.timeout(120)
def test_the_loss_and_the_checkpoints_reach_the_step_mlflow_run(
    whole: Whole, mlflow_url: str
) -> None:
    from mlflow.tracking import MlflowClient

    client, run_id, log = MlflowClient(tracking_uri=mlflow_url), whole.run_id, whole.log

    loss = client.get_metric_history(run_id, "loss")  # rank 0's training loss, each step
    assert sorted(m.step for m in loss) == list(range(1, STEPS + 1))
    assert all(0 < m.value < 2 for m in loss)
    epochs = client.get_metric_history(run_id, "train_loss")  # what the module logs
    printed = re.findall(r"epoch \d: train_loss ([0-9.]+)", log)
    assert [f"{m.value:.4f}" for m in sorted(epochs, key=lambda m: m.step)] == printed
    assert sorted(m.step for m in epochs) == [16, 32, 48]
    data = client.get_run(run_id).data
    final = CheckpointManager(whole.store).latest()
    assert final is not None and final.step == STEPS
    assert data.tags["tideflow.checkpoint.latest"] == final.uri
    assert data.metrics["checkpoint_step"] == STEPS
