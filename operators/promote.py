"""``PromoteCheckpointOperator``: champion/challenger promotion through the MLflow registry.

The challenger is the checkpoint the upstream gang step produced, scored by
the upstream evaluation step. The gate (``tideflow.promotion.gate``) compares
it with the version behind the registry alias. On pass: an MLflow model is
built from the checkpoint (the step's ``builder`` entry point), registered as a
version tagged with its lineage, the alias moves to it (the old champion keeps
``previous-champion``), and the checkpoint is copied under ``promoted/`` in
the store. On fail: the step's run is tagged with the reason and the numbers.
Every decision is an audit record on the registered model. Re-running the step
for the same DAG run registers nothing new and moves no alias again.
"""

from __future__ import annotations

import getpass
import json
import time
from typing import Any

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from tideflow.operators.base import TideflowOperator, finish_tracking, track_step
from tideflow.operators.entrypoints import EntryPointRunner


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
        from tideflow.promotion import decide, registry
        from tideflow.tracking import tracking_enabled

        if not tracking_enabled():
            raise AirflowFailException(
                "tideflow: promotion needs the MLflow Model Registry; set MLFLOW_TRACKING_URI"
            )
        trained = self._pull(context, "checkpoint")
        scored = self._pull(context, "metrics")
        metrics = {k: float(v) for k, v in (scored.get("metrics") or {}).items()}
        if not trained.get("checkpoint"):
            raise AirflowException("tideflow: the training step reported no checkpoint")
        run_id = track_step(self, context, "promote_checkpoint")
        if run_id is None:
            raise AirflowException("tideflow: MLflow is unreachable; promotion needs it")
        mlflow = registry.client()
        registry.ensure_registered_model(mlflow, self.model)
        existing = registry.version_for_run(mlflow, self.model, run_id)
        if existing is not None and existing.tags.get("tideflow.decision") == "promoted":
            self.log.info(
                "tideflow: version %s was already promoted by this DAG run; nothing to do",
                existing.version,
            )
            return {
                "decision": "promoted",
                "version": str(existing.version),
                "alias": self.alias,
                "repeated": True,
            }
        current = registry.champion(mlflow, self.model, self.alias)
        decision = decide(metrics, self.gate, current[1] if current else None)
        who = f"{getpass.getuser()} via Airflow {self.dag_id}/{context['run_id']}/{self.task_id}"
        record = {
            "who": who,
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "what": "",
            "why": decision.summary,
            "checkpoint": trained["checkpoint"],
            "metrics": metrics,
            "champion": None if current is None else str(current[0].version),
        }
        if not decision.promote:
            self.log.info("tideflow: not promoted: %s", decision.summary)
            finish_tracking(
                self,
                run_id,
                succeeded=True,
                tags={
                    "tideflow.decision": "rejected",
                    "tideflow.reason": decision.summary,
                    "tideflow.compared": json.dumps(decision.compared, default=str)[:4900],
                },
            )
            registry.audit(mlflow, self.model, {**record, "what": "rejected"})
            return {"decision": "rejected", "reason": decision.summary, "metrics": metrics}
        version = existing or self._register(context, mlflow, run_id, trained, metrics)
        previous = registry.move_alias(mlflow, self.model, self.alias, str(version.version))
        mlflow.set_model_version_tag(self.model, version.version, "tideflow.decision", "promoted")
        promoted_copy = self._copy_checkpoint(trained, str(version.version))
        record.update(
            what=f"promoted version {version.version} to @{self.alias}",
            previous=previous,
            promoted_copy=promoted_copy,
        )
        registry.audit(mlflow, self.model, record)
        finish_tracking(
            self,
            run_id,
            succeeded=True,
            tags={
                "tideflow.decision": "promoted",
                "tideflow.reason": decision.summary,
                "tideflow.model_version": str(version.version),
            },
        )
        self.log.info(
            "tideflow: promoted %s version %s to @%s (%s)",
            self.model,
            version.version,
            self.alias,
            decision.summary,
        )
        return {
            "decision": "promoted",
            "version": str(version.version),
            "alias": self.alias,
            "previous": previous,
            "reason": decision.summary,
            "metrics": metrics,
            "model_uri": f"models:/{self.model}@{self.alias}",
        }

    def _register(
        self,
        context: Context,
        mlflow: Any,
        run_id: str,
        trained: dict[str, Any],
        metrics: dict[str, float],
    ) -> Any:
        from tideflow.promotion import registry

        if self.builder is None:
            raise AirflowFailException(
                f"tideflow: step '{self.task_id}' has no builder to "
                "turn the checkpoint into an MLflow model"
            )
        args = {
            **self.args,
            "run_id": run_id,
            **{
                k: trained[k]
                for k in ("checkpoint", "checkpoint_store", "checkpoint_step")
                if k in trained
            },
        }
        built = self.run_entrypoint(self.step_context(context), self.builder, args, {})
        if "model_uri" not in built:
            raise AirflowException("tideflow: the builder did not return a model_uri")
        ctx = self.step_context(context)
        tags = {
            "tideflow.pipeline": self.pipeline,
            "tideflow.dag_id": self.dag_id,
            "tideflow.dag_run_id": ctx.run_id,
            "tideflow.promotion_run": run_id,
            "tideflow.checkpoint": str(trained["checkpoint"]),
            "tideflow.checkpoint_checksum": str(trained.get("checkpoint_checksum", "")),
            "tideflow.training_task": self.sources.get("checkpoint", ""),
            **{f"{registry.METRIC_TAG}{k}": str(v) for k, v in metrics.items()},
        }
        training_run = context["ti"].xcom_pull(
            task_ids=self.sources.get("checkpoint"), key="mlflow_run_id"
        )
        if training_run:
            tags["tideflow.training_run"] = str(training_run)
        return registry.register(mlflow, self.model, str(built["model_uri"]), run_id, tags)

    def _copy_checkpoint(self, trained: dict[str, Any], version: str) -> str | None:
        """Keep the promoted checkpoint under promoted/ so retention never deletes it."""
        from tideflow.checkpoint import CheckpointManager

        store = trained.get("checkpoint_store")
        step = trained.get("checkpoint_step")
        if not store or step is None:
            return None
        source = CheckpointManager(str(store))
        manifest = next((m for m in source.committed() if m.step == int(step)), None)
        if manifest is None:
            return None
        from tideflow.config import Settings

        root = Settings.from_env().artifact_root
        target = CheckpointManager(f"{root}/promoted/{self.model}/v{version}")
        shards = {r.name: source.read_shard(manifest, r.name) for r in manifest.shards}
        copied = target.save(
            manifest.step,
            shards,
            manifest.metrics,
            {**manifest.meta, "source": manifest.uri, "source_sha256": manifest.checksum},
        )
        return copied.uri
