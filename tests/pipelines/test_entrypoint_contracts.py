"""The documented calling convention of evaluation entry points and promotion builders."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tideflow.checkpoint import CheckpointError
from tideflow.examples import digits_train
from tideflow.steps.contracts import CONTRACT_KEYS, TrainedCheckpoint, signature_problem


def test_the_contract_keys_are_the_ones_the_steps_pass() -> None:
    from tideflow.steps.evaluation import CHECKPOINT_KEYS

    passed = {key for key in CHECKPOINT_KEYS if key != "checkpoint_checksum"}  # kept back
    assert set(CONTRACT_KEYS["evaluation"]) == passed
    assert set(CONTRACT_KEYS["builder"]) == passed | {"run_id"}


def test_the_example_entry_points_meet_the_contract() -> None:
    assert signature_problem(digits_train.evaluate, "evaluation", {"validation": "x"}) == ""
    assert signature_problem(digits_train.log_model, "builder", {"validation": "x"}) == ""


BUILD_IN_A_FRESH_PROCESS = """
import sys
from tideflow.examples.digits_model import log_model
try:
    log_model(None, checkpoint_store=sys.argv[1], checkpoint_step=1, validation="", run_id="")
except RuntimeError as exc:  # the store is empty: the builder stops at its checkpoint
    print(exc)
print(sorted(name for name in ("lightning", "pytorch_lightning") if name in sys.modules))
"""


@pytest.mark.processes
@pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None, reason="needs Lightning installed"
)
def test_the_example_builder_leaves_lightning_unloaded(tmp_path: Path) -> None:
    """Where Lightning is installed, ``import mlflow.pytorch`` loads it (about 10 s,
    for an autolog callback a builder never uses); the example builder does not."""
    built = subprocess.run(
        [sys.executable, "-c", BUILD_IN_A_FRESH_PROCESS, tmp_path.as_uri()],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    assert built.stdout.splitlines() == ["no committed checkpoint at step 1", "[]"]


def evaluate_ok(ctx: Any, *, validation: str, **checkpoint: Any) -> dict[str, float]:
    return {}


def evaluate_no_ctx(*, checkpoint_store: str, checkpoint_step: int, checkpoint: str) -> None:
    pass


def evaluate_missing_key(ctx: Any, checkpoint_store: str, checkpoint_step: int) -> None:
    pass


def evaluate_requires_more(ctx: Any, threshold: float, **checkpoint: Any) -> None:
    pass


@pytest.mark.parametrize(
    ("function", "problem"),
    [
        (evaluate_ok, ""),
        (evaluate_no_ctx, "no positional parameter for the step context"),
        (evaluate_missing_key, "does not accept keyword argument(s) ['checkpoint', 'validation']"),
        (evaluate_requires_more, "requires ['threshold']"),
    ],
)
def test_a_signature_that_cannot_take_the_arguments_is_named(function: Any, problem: str) -> None:
    found = signature_problem(function, "evaluation", {"validation": "s3://b/val.npz"})
    assert (problem in found) if problem else found == ""


def test_a_builder_must_take_the_run_id() -> None:
    def builder(ctx: Any, checkpoint_store: str, checkpoint_step: int, checkpoint: str) -> None:
        pass

    assert "['run_id']" in signature_problem(builder, "builder", {})


def test_arguments_without_a_checkpoint_are_refused_by_name() -> None:
    with pytest.raises(CheckpointError, match="checkpoint_step"):
        TrainedCheckpoint.from_arguments({"checkpoint_store": "file:///x"})
