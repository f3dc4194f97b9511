"""Running a step's entry point in a child process, shared by the CPU-side operators.

The work is ``tideflow.steps.entrypoints`` (no Airflow, also used by the
standalone executor Argo runs); this mixin sends the child's lines to the task
log, keeps the child for ``on_kill`` and raises Airflow's exception on failure.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk.exceptions import AirflowException

from tideflow.steps.context import StepContext
from tideflow.steps.entrypoints import ARGS_ENV, StepError, describe, run_entrypoint
from tideflow.steps.process import StreamedProcess

__all__ = ["ARGS_ENV", "EntryPointRunner", "describe"]


class EntryPointRunner:
    """Runs ``entrypoint`` in its own process group and returns its outputs mapping.

    A ``module:function`` entry point is called as ``function(ctx, **args)``;
    a command reads ``$TIDEFLOW_STEP_CONTEXT`` and ``$TIDEFLOW_STEP_ARGS`` and
    writes JSON to ``$TIDEFLOW_STEP_OUTPUTS``. The pipeline's code directory
    (the operator's ``code_path``) is first on the child's ``PYTHONPATH``. Every
    line the child prints goes to the task log; a non-zero exit raises with the
    child's last lines.
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
        def started(child: StreamedProcess) -> None:
            self._child = child

        try:
            return run_entrypoint(
                ctx,
                entrypoint,
                args,
                env,
                step=self.task_id,
                on_line=lambda line: self.log.info("%s", line),
                on_start=started,
                code_path=getattr(self, "code_path", None),
            )
        except StepError as exc:
            raise AirflowException(str(exc)) from exc

    def on_kill(self) -> None:
        if self._child is not None:
            self._child.stop()
