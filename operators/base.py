"""What every tideflow operator shares: pipeline identity and the step context."""

from __future__ import annotations

from typing import Any

import jinja2
from airflow.sdk import BaseOperator, Context

from tideflow.operators.hook import TideflowHook
from tideflow.operators.links import MLFLOW_RUN_URL_KEY, MlflowRunLink
from tideflow.operators.settings_check import check_settings_at_start
from tideflow.operators.templating import render_typed, template_env
from tideflow.steps.context import StepContext


def _plain(value: Any) -> Any:
    """Params arrive as Airflow ``Param`` wrappers in some code paths; keep only values."""
    return getattr(value, "value", value)


class TideflowOperator(BaseOperator):
    """Base of the four step operators. ``__init__`` only stores arguments."""

    ui_color = "#d6eaf8"
    operator_extra_links = (MlflowRunLink(),)

    def __init__(
        self, *, pipeline: str, team: str, code_path: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.team = team
        # The pipeline's modules (code.path, resolved): first on PYTHONPATH of the step's
        # processes.
        self.code_path = code_path

    # Templates render typed and sandboxed, never literal_eval'd (tideflow.operators.templating)
    def get_template_env(self, dag: Any = None) -> jinja2.Environment:
        return template_env()

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        # Airflow's task runner passes the DAG's environment; ours compiles templates to
        # yield values, which the DAG's (sandboxed, text) environment cannot.
        super().render_template_fields(context, template_env())

    @property
    def hook(self) -> TideflowHook:
        """Where the step reads the platform's settings and opens the lease ledger."""
        return TideflowHook()

    def pre_execute(self, context: Any) -> None:
        """A setting the step cannot use fails it here, named (``settings_check``)."""
        check_settings_at_start()

    def _render(self, template: Any, context: Any, dag: Any = None) -> Any:
        return render_typed(template, context)

    def step_context(self, context: Context, outputs: tuple[str, ...] = ()) -> StepContext:
        settings = self.hook.settings()
        ti = context["ti"]
        params = {key: _plain(value) for key, value in dict(context["params"]).items()}
        return StepContext(
            pipeline=self.pipeline,
            team=self.team,
            step=self.task_id,
            dag_id=self.dag_id,
            run_id=context["run_id"],
            try_number=int(ti.try_number or 1),
            artifact_root=settings.artifact_root,
            params=params,
            outputs=outputs,
        )


def track_step(operator: TideflowOperator, context: Context, kind: str) -> str | None:
    """The step's MLflow run id (nested under the DAG run's), or None when untracked.

    MLflow being down never fails a step: it is logged and the step runs untracked.
    """
    from tideflow.tracking import ensure_runs, run_url, tracking_enabled

    if not tracking_enabled():
        return None
    ctx = operator.step_context(context)
    try:
        ids = ensure_runs(
            pipeline=operator.pipeline,
            team=operator.team,
            dag_id=operator.dag_id,
            dag_run_id=ctx.run_id,
            step=operator.task_id,
            kind=kind,
            params=ctx.params,
        )
    except Exception as exc:
        operator.log.warning("tideflow: MLflow is unreachable (%s); the step runs untracked", exc)
        return None
    context["ti"].xcom_push(key="mlflow_run_id", value=ids.step_run_id)
    url = run_url(ids.experiment_id, ids.step_run_id)
    if url:
        context["ti"].xcom_push(key=MLFLOW_RUN_URL_KEY, value=url)
    operator.log.info("tideflow: MLflow run %s (parent %s)", ids.step_run_id, ids.pipeline_run_id)
    return ids.step_run_id


def finish_tracking(
    operator: TideflowOperator,
    run_id: str | None,
    *,
    succeeded: bool,
    tags: dict[str, str] | None = None,
    metrics: dict[str, float] | None = None,
) -> None:
    from tideflow.tracking import finish_step_run_or_warn

    finish_step_run_or_warn(
        run_id, operator.log.warning, succeeded=succeeded, tags=tags, metrics=metrics
    )
