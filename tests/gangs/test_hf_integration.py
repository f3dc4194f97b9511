"""HF ``transformers.Trainer`` with ``tideflow.integrations.hf.TideflowCallback``, as real gangs.

The script under test is ``tests/user_code/hf_trainer_train.py``: a tiny GPT-2
built from a config, trained by Trainer on two gloo workers under torchrun's
environment from the local gang backend. Each interrupted run (a worker killed
with SIGKILL, the gang preempted with SIGTERM) is compared, bit for bit, with
the same script run without a checkpoint store (the callback then does
nothing), uninterrupted.
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


# A gang's ranks import the framework (about 12 CPU-s each) at every start: a test
# that starts one twice took over 70 s of its old 90 s limit in the suite on two cores.
@pytest.mark.timeout(240)
def test_kill_9_of_rank_1_resumes_from_the_committed_checkpoint_bitwise(
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
    reached = wait_for_checkpoint(store, 15)
    kill_rank(backend, "crash", 1)
    status = backend.wait("crash", 200)
    text = backend.log_path("crash").read_text()
    assert status.state is GangState.SUCCEEDED and status.restarts == 1, text[-4000:]
    found = re.search(r"resumed from checkpoint step (\d+) \(restart 1\)", text)
    assert found is not None, text[-4000:]
    resumed = int(found.group(1))
    assert 15 <= reached <= resumed < STEPS and resumed % 5 == 0
    assert f"relaunching; the newest committed checkpoint is step {resumed}" in text
    assert report(tmp_path) == reference


@pytest.mark.timeout(240)
def test_sigterm_commits_exits_75_and_the_resubmitted_gang_resumes_bitwise(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    store = (tmp_path / "ckpt").as_uri()
    # every 1000 steps: the only checkpoint before the end is the one SIGTERM asks for
    env = policy(store, every_steps=1000)
    backend = LocalBackend(tmp_path / "gangs")
    backend.submit(gang("evict", SCRIPT, tmp_path, env, extra=("--step-sleep", "0.1")))
    wait_for_log(backend, "evict", r"'epoch': '0\.5'")  # 8 steps in
    status, text = preempt_and_wait(backend, "evict")
    assert status.state is GangState.PREEMPTED and status.exit_codes == (75, 75), text[-4000:]
    committed = CheckpointManager(store).latest()
    assert committed is not None and 8 <= committed.step < STEPS
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
