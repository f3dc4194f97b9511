"""Run a step's entry point in a child process and read back what it returned.

Shared by the Airflow operators (``tideflow.operators.entrypoints`` wraps it
and turns ``StepError`` into Airflow's exceptions) and by the standalone
executor that Argo's step containers run (``tideflow.steps.standalone``), so
both call entry points the same way.

A ``module:function`` entry point is called as ``function(ctx, **args)`` through
``python -m tideflow.steps.runner``; a command reads ``$TIDEFLOW_STEP_CONTEXT``
and ``$TIDEFLOW_STEP_ARGS`` and writes JSON to ``$TIDEFLOW_STEP_OUTPUTS``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tideflow.steps.code import with_code_path
from tideflow.steps.commands import resolve_command
from tideflow.steps.context import CONTEXT_ENV, OUTPUTS_ENV, StepContext
from tideflow.steps.process import StreamedProcess

ARGS_ENV = "TIDEFLOW_STEP_ARGS"


class StepError(Exception):
    """A step cannot go on; the message names the step and says why.

    ``final`` marks failures a retry cannot fix (a missing builder, say), so a
    caller that retries can fail at once instead.
    """

    def __init__(self, message: str, *, final: bool = False) -> None:
        super().__init__(message)
        self.final = final


def describe(entrypoint: str | Sequence[str]) -> str:
    if isinstance(entrypoint, str):
        return f"entry point {entrypoint}"
    return f"command {entrypoint[0]!r}"


def _step_command(entrypoint: str | Sequence[str], files: dict[str, Path]) -> list[str]:
    """A module:function runs in tideflow's step runner, given its files; a command as is."""
    if not isinstance(entrypoint, str):
        return resolve_command(entrypoint)
    paths = (str(files[name]) for name in ("context", "args", "out"))
    return [sys.executable, "-m", "tideflow.steps.runner", entrypoint, *paths]


def run_entrypoint(
    ctx: StepContext,
    entrypoint: str | Sequence[str],
    args: dict[str, Any],
    env: dict[str, str],
    *,
    step: str,
    on_line: Callable[[str], None],
    on_start: Callable[[StreamedProcess], None] | None = None,
    code_path: str | None = None,
) -> dict[str, Any]:
    """Run ``entrypoint`` in its own process group; return its outputs mapping.

    Every line the child prints goes to ``on_line``; ``on_start`` gets the child
    so that a caller can stop it (Airflow's ``on_kill``). ``code_path`` (the
    pipeline's ``code.path``, resolved) goes first on the child's ``PYTHONPATH``.
    A non-zero exit raises ``StepError`` with the child's last lines.
    """
    with tempfile.TemporaryDirectory(prefix="tideflow-step-") as scratch:
        files = {name: Path(scratch) / f"{name}.json" for name in ("context", "args", "out")}
        files["context"].write_text(ctx.to_json(), encoding="utf-8")
        files["args"].write_text(json.dumps(args, default=str), encoding="utf-8")
        child_env = {
            **os.environ,
            **with_code_path({k: str(v) for k, v in env.items()}, code_path),
            CONTEXT_ENV: str(files["context"]),
            ARGS_ENV: str(files["args"]),
            OUTPUTS_ENV: str(files["out"]),
            "PYTHONUNBUFFERED": "1",
        }
        command = _step_command(entrypoint, files)
        on_line(f"tideflow: running {' '.join(command)}")
        try:
            child = StreamedProcess(command, child_env)
        except OSError as exc:
            raise StepError(f"cannot start {command[0]!r}: {exc}") from exc
        if on_start is not None:
            on_start(child)
        try:
            code = child.stream(on_line)
        except BaseException:
            # Interrupted while it runs (Ctrl-C reaching the task as KeyboardInterrupt,
            # a timeout): stop its process group rather than leave it running alone.
            child.stop()
            raise
        if code != 0:
            tail = "\n".join(child.tail)
            raise StepError(
                f"step '{step}': {describe(entrypoint)} exited with code {code}; "
                f"last output:\n{tail}"
            )
        return read_outputs(files["out"], step)


def read_outputs(path: Path, step: str) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise StepError(f"step '{step}': outputs file is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise StepError(f"step '{step}': outputs must be a JSON object")
    return {str(k): v for k, v in data.items()}


def declared_outputs(
    step: str, entrypoint: str | Sequence[str], declared: Sequence[str], returned: dict[str, Any]
) -> dict[str, str]:
    """A data-prep step's outputs as strings; every declared one must be there."""
    outputs = {name: str(value) for name, value in returned.items()}
    missing = [name for name in declared if name not in outputs]
    if missing:
        raise StepError(
            f"step '{step}': {describe(entrypoint)} did not return declared "
            f"output(s) {missing}; it returned {sorted(outputs)}"
        )
    return outputs
