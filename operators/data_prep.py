"""``DataPrepOperator``: run a Python entry point or a command on the CPU pool."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowException

from tideflow.operators.base import TideflowOperator, finish_tracking, track_step
from tideflow.steps.commands import resolve_command
from tideflow.steps.context import CONTEXT_ENV, OUTPUTS_ENV
from tideflow.steps.process import StreamedProcess

ARGS_ENV = "TIDEFLOW_STEP_ARGS"


class DataPrepOperator(TideflowOperator):
    """Runs ``entrypoint`` in a child process and returns its outputs through XCom.

    A ``module:function`` entry point is called as ``function(ctx, **args)`` and
    returns ``{output name: path or URI}``. A command (list of strings) reads its
    context from ``$TIDEFLOW_STEP_CONTEXT``, its args from ``$TIDEFLOW_STEP_ARGS``
    and writes its outputs as JSON to ``$TIDEFLOW_STEP_OUTPUTS``. Every line the
    child prints goes to the task log; a non-zero exit fails the task with the
    child's last lines in the error.
    """

    template_fields = ("entrypoint", "args", "env")
    template_fields_renderers = {"args": "json", "env": "json"}

    def __init__(
        self,
        *,
        entrypoint: str | list[str],
        args: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        outputs: tuple[str, ...] | list[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.entrypoint = entrypoint
        self.args = args or {}
        self.env = env or {}
        self.outputs = tuple(outputs)
        self._child: StreamedProcess | None = None

    def execute(self, context: Context) -> dict[str, str]:
        run_id = track_step(self, context, "data_prep")
        try:
            outputs = self._run(context)
        except BaseException:
            finish_tracking(self, run_id, succeeded=False)
            raise
        finish_tracking(
            self,
            run_id,
            succeeded=True,
            tags={f"tideflow.output.{name}": uri for name, uri in outputs.items()},
        )
        return outputs

    def _run(self, context: Context) -> dict[str, str]:
        ctx = self.step_context(context, self.outputs)
        with tempfile.TemporaryDirectory(prefix="tideflow-step-") as scratch:
            files = {name: Path(scratch) / f"{name}.json" for name in ("context", "args", "out")}
            files["context"].write_text(ctx.to_json(), encoding="utf-8")
            files["args"].write_text(json.dumps(self.args, default=str), encoding="utf-8")
            env = {
                **os.environ,
                **{k: str(v) for k, v in self.env.items()},
                CONTEXT_ENV: str(files["context"]),
                ARGS_ENV: str(files["args"]),
                OUTPUTS_ENV: str(files["out"]),
                "PYTHONUNBUFFERED": "1",
            }
            if isinstance(self.entrypoint, str):
                command = [
                    sys.executable,
                    "-m",
                    "tideflow.steps.runner",
                    self.entrypoint,
                    *(str(files[n]) for n in ("context", "args", "out")),
                ]
            else:
                command = resolve_command(self.entrypoint)
            self.log.info("tideflow: running %s", " ".join(command))
            try:
                self._child = StreamedProcess(command, env)
            except OSError as exc:
                raise AirflowException(f"cannot start {command[0]!r}: {exc}") from exc
            code = self._child.stream(lambda line: self.log.info("%s", line))
            if code != 0:
                tail = "\n".join(self._child.tail)
                raise AirflowException(
                    f"step '{self.task_id}': {self._describe()} exited with code {code}; "
                    f"last output:\n{tail}"
                )
            outputs = self._read_outputs(files["out"])
        missing = [name for name in self.outputs if name not in outputs]
        if missing:
            raise AirflowException(
                f"step '{self.task_id}': {self._describe()} did not return declared "
                f"output(s) {missing}; it returned {sorted(outputs)}"
            )
        for name, uri in sorted(outputs.items()):
            self.log.info("tideflow: output %s = %s", name, uri)
        return outputs

    def _describe(self) -> str:
        if isinstance(self.entrypoint, str):
            return f"entry point {self.entrypoint}"
        return f"command {self.entrypoint[0]!r}"

    def _read_outputs(self, path: Path) -> dict[str, str]:
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
        return {str(k): str(v) for k, v in data.items()}

    def on_kill(self) -> None:
        if self._child is not None:
            self._child.stop()
