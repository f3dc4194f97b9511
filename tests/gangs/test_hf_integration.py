"""HF ``transformers.Trainer`` with ``tideflow.integrations.hf.TideflowCallback``, as real gangs.

The script under test is ``tests/user_code/hf_trainer_train.py``: a tiny GPT-2
built from a config, trained by Trainer on two gloo workers under torchrun's
environment from the local gang backend. An interrupted run (a worker killed
with SIGKILL, then the restarted gang preempted with SIGTERM) is compared, bit
for bit, with the same script run without a checkpoint store (the callback
then does nothing), uninterrupted.
"""

from __future__ import annotations

import re
import subprocess
import sys
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

# Found, not imported: importing them takes seconds, and the tests run them in workers.
pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(
        find_spec("transformers") is None,
        reason="the HF integration needs transformers: pip install -e '.[hf]'",
    ),
    pytest.mark.skipif(
        find_spec("accelerate") is None,
        reason="HF Trainer needs accelerate: pip install -e '.[hf]'",
    ),
]

SCRIPT = Path(__file__).parents[1] / "user_code" / "hf_trainer_train.py"
STEPS = 48  # 3 epochs x 256 samples / (8 per device x 2 ranks)


def test_importing_tideflow_and_its_integrations_package_loads_no_framework() -> None:
    code = (
        "import sys, tideflow, tideflow.integrations; "
        "print([m for m in ('transformers', 'accelerate', 'lightning') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The script without a checkpoint store, uninterrupted: the weights to match."""
    root = tmp_path_factory.mktemp("hf-reference")
    run(LocalBackend(root / "gangs"), gang("reference", SCRIPT, root, {}))
    return report(root)


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory, mlflow_url: str) -> Whole:
    """The uninterrupted, checkpointed and tracked run two tests read."""
    root = tmp_path_factory.mktemp("hf-whole")
    return whole_run(root, SCRIPT, mlflow_url, "hf-integration")


@pytest.mark.timeout(240)  # the reference and the whole run start here
def test_an_uninterrupted_run_commits_trainer_checkpoints_and_trains_unchanged(
    whole: Whole, reference: dict[str, Any]
) -> None:
    assert report(whole.root) == reference  # neither the store nor MLflow changed training
    manager = CheckpointManager(whole.store)
    # every 5 steps (TIDEFLOW_CHECKPOINT_EVERY_STEPS; the script says save_strategy="no")
    # and the final step; keep_last 3
    assert [m.step for m in manager.committed()] == [40, 45, STEPS]
    final = manager.latest()
    assert final is not None
    assert final.meta == {"framework": "transformers", "world_size": 2}
    names = {shard.name for shard in final.shards}
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"} <= names
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= names  # each rank's own file
    assert final.metrics["loss"] > 0


# A gang's ranks import the framework (about 12 CPU-s each) at every start, and this
# test starts one three times.
@pytest.mark.timeout(300)
def test_a_killed_rank_and_a_later_sigterm_each_resume_from_a_committed_checkpoint_bitwise(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    backend = LocalBackend(tmp_path / "gangs")
    interrupted = killed_then_preempted(backend, SCRIPT, tmp_path, kill_after=15, steps=STEPS)
    assert interrupted.resumed < interrupted.preempted
    assert report(tmp_path) == reference


@pytest.mark.timeout(240)
def test_the_guard_stops_a_diverging_run_with_exit_76_and_marks_the_last_good_checkpoint(
    tmp_path: Path,
) -> None:
    store = (tmp_path / "ckpt").as_uri()
    backend = LocalBackend(tmp_path / "gangs")
    backend.submit(gang("diverge", SCRIPT, tmp_path, policy(store, 1), extra=("--lr", "30")))
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
def test_the_logged_loss_and_the_checkpoints_reach_the_step_mlflow_run(
    whole: Whole, mlflow_url: str
) -> None:
    from mlflow.tracking import MlflowClient

    client, run_id, log = MlflowClient(tracking_uri=mlflow_url), whole.run_id, whole.log

    history = client.get_metric_history(run_id, "loss")
    assert sorted(m.step for m in history) == list(range(1, STEPS + 1))  # logging_steps=1
    logged = re.findall(r"\{'loss': '([0-9.]+)'", log)  # what Trainer printed, 4 digits
    by_step = {m.step: m.value for m in history}
    assert [f"{by_step[step]:.4g}" for step in range(1, STEPS + 1)] == logged
    data = client.get_run(run_id).data
    final = CheckpointManager(whole.store).latest()
    assert final is not None and final.step == STEPS
    assert data.tags["tideflow.checkpoint.latest"] == final.uri
    assert data.metrics["checkpoint_step"] == STEPS
