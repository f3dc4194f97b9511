"""Running a step's entry point in a child process, shared by the CPU-side operators."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from airflow.sdk.exceptions import AirflowException

from tideflow.steps.commands import resolve_command
from tideflow.steps.context import CONTEXT_ENV, OUTPUTS_ENV, StepContext
from tideflow.steps.process import StreamedProcess

ARGS_ENV = "TIDEFLOW_STEP_ARGS"


def describe(entrypoint: str | list[str]) -> str:
    if isinstance(entrypoint, str):
        return f"entry point {entrypoint}"
    return f"command {entrypoint[0]!r}"


class EntryPointRunner:
    """Runs ``entrypoint`` in its own process group and returns its outputs mapping.

    A ``module:function`` entry point is called as ``function(ctx, **args)``;
    a command reads ``$TIDEFLOW_STEP_CONTEXT`` and ``$TIDEFLOW_STEP_ARGS`` and
    writes JSON to ``$TIDEFLOW_STEP_OUTPUTS``. Every line the child prints goes
    to the task log; a non-zero exit raises with the child's last lines.
    """

    task_id: str
    log: Any
    _child: StreamedProcess | None = None

    def run_entrypoint(
        self,
        ctx: StepContext,
        entrypoint: str | list[str],
        args: dict[str, Any],
        env: dict[str, str],
    ) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="tideflow-step-") as scratch:
            files = {name: Path(scratch) / f"{name}.json" for name in ("context", "args", "out")}
            files["context"].write_text(ctx.to_json(), encoding="utf-8")
            files["args"].write_text(json.dumps(args, default=str), encoding="utf-8")
            child_env = {
                **os.environ,
                **{k: str(v) for k, v in env.items()},
                CONTEXT_ENV: str(files["context"]),
                ARGS_ENV: str(files["args"]),
                OUTPUTS_ENV: str(files["out"]),
                "PYTHONUNBUFFERED": "1",
            }
            if isinstance(entrypoint, str):
                command = [
                    sys.executable,
                    "-m",
                    "tideflow.steps.runner",
                    entrypoint,
                    *(str(files[n]) for n in ("context", "args", "out")),
                ]
            else:
                command = resolve_command(entrypoint)
            self.log.info("tideflow: running %s", " ".join(command))
            try:
                self._child = StreamedProcess(command, child_env)
            except OSError as exc:
                raise AirflowException(f"cannot start {command[0]!r}: {exc}") from exc
            code = self._child.stream(lambda line: self.log.info("%s", line))
            if code != 0:
                tail = "\n".join(self._child.tail)
                raise AirflowException(
                    f"step '{self.task_id}': {describe(entrypoint)} exited with code {code}; "
                    f"last output:\n{tail}"
                )
            return self._read_outputs(files["out"])

    def _read_outputs(self, path: Path) -> dict[str, Any]:
        if not path.exists():
            return {}
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise AirflowException(
                f"step '{self.task_id}': outputs file is not JSON: {exc}"
            ) from exc
        if not isinstance(data, dict):
            raise AirflowException(f"step '{self.task_id}': outputs must be a JSON object")
        return {str(k): v for k, v in data.items()}

    def on_kill(self) -> None:
        if self._child is not None:
            self._child.stop()
