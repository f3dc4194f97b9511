"""``DataPrepOperator``: run a Python entry point or a command on the CPU pool."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowException

from tideflow.operators.base import TideflowOperator, finish_tracking, track_step
from tideflow.operators.entrypoints import EntryPointRunner
from tideflow.steps.entrypoints import StepError, declared_outputs


class DataPrepOperator(EntryPointRunner, TideflowOperator):
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
        raw = self.run_entrypoint(ctx, self.entrypoint, self.args, self.env)
        try:
            outputs = declared_outputs(self.task_id, self.entrypoint, self.outputs, raw)
        except StepError as exc:
            raise AirflowException(str(exc)) from exc
        for name, uri in sorted(outputs.items()):
            self.log.info("tideflow: output %s = %s", name, uri)
        return outputs
