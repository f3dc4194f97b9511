"""PyTorch Lightning with ``tideflow.integrations.lightning.TideflowCallback``, as real gangs.

The script under test is ``tests/user_code/lightning_train.py``: a small
classifier with dropout, SGD with momentum and a per-step LR schedule, trained
with ``strategy="ddp"`` on two gloo workers under torchrun's environment from
the local gang backend (Lightning detects TorchElastic and joins the gang).
An interrupted run (a worker killed with SIGKILL mid-epoch, then the
restarted gang preempted with SIGTERM) is compared, bit for bit, with the same
script run without a checkpoint store (the callback then saves nothing),
uninterrupted.
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
    killed_then_preempted,
    policy,
    report,
    run,
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


# A gang's ranks import the framework (about 12 CPU-s each) at every start, and this
# test starts one three times.
@pytest.mark.timeout(300)
def test_a_killed_rank_and_a_later_sigterm_each_resume_from_a_committed_checkpoint_bitwise(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    backend = LocalBackend(tmp_path / "gangs")
    interrupted = killed_then_preempted(backend, SCRIPT, tmp_path, kill_after=20, steps=STEPS)
    assert interrupted.resumed < interrupted.preempted
    assert report(tmp_path) == reference
    if interrupted.resumed % PER_EPOCH:  # mid-epoch: the data moved past what was trained on
        skipped = interrupted.resumed % PER_EPOCH
        epoch = interrupted.resumed // PER_EPOCH
        assert f"skipped the {skipped} batches of epoch {epoch}" in interrupted.log


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
