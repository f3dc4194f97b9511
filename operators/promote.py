"""``PromoteCheckpointOperator``: champion/challenger promotion through the MLflow registry.

The challenger is the checkpoint of the upstream gang step that the upstream
evaluation step scored (the one its ``checkpoint`` chose; the gang's newest when
the evaluation read another gang). The gate (``tideflow.promotion.gate``)
compares it with the version behind the registry alias: it must beat the
champion by more than ``min_delta`` (a tie never promotes). A gate metric the
evaluation did not produce fails the task at once, without retries: the
pipeline is misconfigured. On pass: an MLflow model is
built from the checkpoint (the step's ``builder`` entry point), registered as a
version tagged with its lineage, the alias moves to it (the old champion keeps
``previous-champion``), and the checkpoint is copied under ``promoted/`` in
the store. On fail: the step's run is tagged with the reason and the numbers.
Every decision is an audit record on the registered model. Re-running the step
for the same DAG run registers nothing new and moves no alias again. The
decision and the registry moves are ``tideflow.promotion.promote`` (shared with
the standalone executor Argo runs); this operator finds the challenger through
XCom and maps failures to Airflow's exceptions (a final one, such as a
misconfigured gate, to ``AirflowFailException``).
"""

from __future__ import annotations

import getpass
from typing import TYPE_CHECKING, Any

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from tideflow.operators.base import TideflowOperator, finish_tracking, track_step
from tideflow.operators.entrypoints import EntryPointRunner

if TYPE_CHECKING:
    from tideflow.promotion.promote import PromotionRequest


class PromoteCheckpointOperator(EntryPointRunner, TideflowOperator):
    template_fields = ("gate", "args")
    template_fields_renderers = {"gate": "json", "args": "json"}
    ui_color = "#fadbd8"

    def __init__(
        self,
        *,
        model: str,
        gate: dict[str, Any],
        alias: str = "champion",
        builder: str | list[str] | None = None,
        args: dict[str, Any] | None = None,
        sources: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.model = model
        self.gate = gate
        self.alias = alias
        self.builder = builder
        self.args = args or {}
        self.sources = sources or {}

    def _pull(self, context: Context, role: str) -> dict[str, Any]:
        task = self.sources.get(role)
        if task is None:
            raise AirflowFailException(
                f"tideflow: step '{self.task_id}' needs an upstream "
                f"{'gang_training' if role == 'checkpoint' else 'evaluation'}"
                " step"
            )
        return dict(context["ti"].xcom_pull(task_ids=task) or {})

    def execute(self, context: Context) -> dict[str, Any]:
        from tideflow.promotion.promote import PromotionRequest
        from tideflow.tracking import tracking_enabled

        if not tracking_enabled():
            raise AirflowFailException(
                "tideflow: promotion needs the MLflow Model Registry; set MLFLOW_TRACKING_URI"
            )
        trained, metrics, selection = self._challenger(context)
        if not trained.get("checkpoint"):
            raise AirflowException("tideflow: the training step reported no checkpoint")
        run_id = track_step(self, context, "promote_checkpoint")
        if run_id is None:
            raise AirflowException("tideflow: MLflow is unreachable; promotion needs it")
        ctx = self.step_context(context)
        lineage = self._lineage(context, ctx.run_id)
        request = PromotionRequest(
            step=self.task_id,
            model=self.model,
            alias=self.alias,
            gate=self.gate,
            metrics=metrics,
            trained=trained,
            run_id=run_id,
            who=f"{getpass.getuser()} via Airflow {self.dag_id}/{ctx.run_id}/{self.task_id}",
            artifact_root=self.hook.settings().artifact_root,
            builder=self.builder,
            builder_args=self.args,
            lineage=lineage,
            selection=selection,
        )
        return self._promote(context, request)

    def _challenger(
        self, context: Context
    ) -> tuple[dict[str, Any], dict[str, float], dict[str, str]]:
        """The checkpoint to promote, the evaluation's metrics of it, and how it was chosen."""
        from tideflow.steps.evaluation import SELECTION_OUTPUT, checkpoint_facts, selection_tags

        trained = self._pull(context, "checkpoint")
        scored = self._pull(context, "metrics")
        metrics = {k: float(v) for k, v in (scored.get("metrics") or {}).items()}
        evaluated = checkpoint_facts(scored)
        selection: dict[str, str] = {}
        if evaluated.get("checkpoint") and evaluated.get("checkpoint_store") == trained.get(
            "checkpoint_store"
        ):
            # Promote exactly the checkpoint the evaluation scored (its checkpoint: best
            # may be an earlier one than the gang's newest).
            trained = evaluated
            selection = selection_tags(scored.get(SELECTION_OUTPUT))
        return trained, metrics, selection

    def _lineage(self, context: Context, dag_run_id: str) -> dict[str, str]:
        """Where the registered version comes from: pipeline, DAG run, training task and run."""
        lineage = {
            "tideflow.pipeline": self.pipeline,
            "tideflow.dag_id": self.dag_id,
            "tideflow.dag_run_id": dag_run_id,
            "tideflow.training_task": self.sources.get("checkpoint", ""),
        }
        training_run = context["ti"].xcom_pull(
            task_ids=self.sources.get("checkpoint"), key="mlflow_run_id"
        )
        if training_run:
            lineage["tideflow.training_run"] = str(training_run)
        return lineage

    def _promote(self, context: Context, request: PromotionRequest) -> dict[str, Any]:
        """Decide and move the registry; a final failure also closes the step's run."""
        from tideflow.promotion import registry
        from tideflow.promotion.promote import PromotionError, promote

        def build(builder: str | list[str], args: dict[str, Any]) -> dict[str, Any]:
            return self.run_entrypoint(self.step_context(context), builder, args, {})

        try:
            result = promote(registry.client(), request, build, self.log.info)
        except PromotionError as exc:
            if exc.final:  # misconfigured: nothing a retry can change; the run says why
                finish_tracking(
                    self,
                    request.run_id,
                    succeeded=False,
                    tags={"tideflow.decision": "failed", "tideflow.reason": str(exc)[:4900]},
                )
                raise AirflowFailException(str(exc)) from exc
            raise AirflowException(str(exc)) from exc
        if result.run_tags is not None:
            finish_tracking(self, request.run_id, succeeded=True, tags=result.run_tags)
        return result.outputs
