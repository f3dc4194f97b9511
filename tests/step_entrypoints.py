"""Entry points used by the DataPrepOperator tests (imported by the step's child process)."""

from __future__ import annotations

from tideflow.steps import StepContext


def boom(ctx: StepContext, reason: str = "deliberately broken") -> dict[str, str]:
    print(f"about to fail in step {ctx.step}")
    raise ValueError(reason)


def forgets_an_output(ctx: StepContext) -> dict[str, str]:
    return {"train": "file:///tmp/train.npz"}
