"""``EvaluationOperator``: evaluate a checkpoint on an NPU, a spare GPU, or the CPU.

The device is the first of the step's preferences that can be had now (see
``tideflow.scheduling.preference``); when none can and the CPU is not allowed,
the task defers until one frees up, holding nothing. The entry point gets the
device through ``TIDEFLOW_DEVICE_CLASS`` (``tideflow.runtime.device_for_class``
turns it into a ``torch.device``), a checkpoint of the upstream gang step through
its args (``checkpoint``: the best by the gang's ``keep_best`` metric, or the
latest; ``tideflow.steps.evaluation.select_checkpoint``), and returns the
declared metrics, which go to the step's MLflow run and downstream through XCom
with the checkpoint and how it was chosen (promotion promotes that checkpoint).
"""

from __future__ import annotations

import time
from typing import Any

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from tideflow.operators.base import TideflowOperator, finish_tracking, track_step
from tideflow.operators.entrypoints import EntryPointRunner
from tideflow.operators.trigger_base import TriggerStatus
from tideflow.operators.triggers import DeviceTrigger
from tideflow.steps.entrypoints import StepError
from tideflow.steps.evaluation import (
    DEFAULT_CHECKPOINT_CHOICE,
    SELECTION_OUTPUT,
    Selection,
    checkpoint_facts,
    declared_metrics,
    entrypoint_args,
    select_checkpoint,
)

LEASE_TTL_S = 3600.0
_VISIBLE = {"gpu": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}


class EvaluationOperator(EntryPointRunner, TideflowOperator):
    template_fields = ("entrypoint", "args", "env", "keep_best")
    template_fields_renderers = {"args": "json", "env": "json"}
    ui_color = "#d5f5e3"

    def __init__(
        self,
        *,
        entrypoint: str | list[str],
        metrics: tuple[str, ...] | list[str],
        devices: tuple[str, ...] | list[str] = ("npu", "gpu-spare", "cpu"),
        args: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        sources: dict[str, str] | None = None,
        checkpoint: str = DEFAULT_CHECKPOINT_CHOICE,
        keep_best: dict[str, Any] | None = None,
        poll_s: float = 5.0,
        wait_timeout_s: float = 24 * 3600,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.entrypoint = entrypoint
        self.metrics = tuple(metrics)
        self.devices = tuple(devices)
        self.args = args or {}
        self.env = env or {}
        self.sources = sources or {}
        self.checkpoint = checkpoint
        self.keep_best = keep_best
        self.poll_s = poll_s
        self.wait_timeout_s = wait_timeout_s

    def _ledger_args(self, context: Context) -> dict[str, Any]:
        from tideflow.gangs import gang_id_for, holder_name

        settings = self.hook.settings()
        return {
            "gang_id": gang_id_for(self.dag_id, context["run_id"], self.task_id),
            "team": self.team,
            "holder": holder_name(),
            "ledger_path": str(settings.ledger_path),
            "cluster_file": settings.cluster,
        }

    def execute(self, context: Context) -> Any:
        from tideflow.scheduling import Refusal, choose_device

        settings = self.hook.settings()
        if settings.backend == "kubernetes":
            # The task pod was made with the device (tideflow.kube.pods.task_pod);
            # the cluster's scheduler, not the lease ledger, waited for it.
            from tideflow.inventory import load_cluster
            from tideflow.kube.pods import evaluation_device

            inventory = load_cluster(settings.cluster_file) if settings.cluster_file else None
            where = evaluation_device(self.devices, inventory)
            return self._evaluate(context, where, where.split("-")[0], None)

        ledger_args = self._ledger_args(context)
        ledger = self.hook.ledger()
        choice = choose_device(
            ledger,
            self.devices,
            gang_id=ledger_args["gang_id"],
            team=self.team,
            holder=ledger_args["holder"],
            ttl_s=LEASE_TTL_S,
        )
        if not isinstance(choice, Refusal):
            return self._evaluate(context, choice.preference, choice.device_class, choice.lease)
        if choice.never:
            raise AirflowFailException(
                f"tideflow: no device of {list(self.devices)} exists: {choice.reason}"
            )
        self.log.info(
            "tideflow: no device free now, waiting without holding any: %s", choice.reason
        )
        start = context["ti"].start_date
        deadline = (start.timestamp() if start else time.time()) + self.wait_timeout_s
        self.defer(
            trigger=DeviceTrigger(
                preferences=list(self.devices),
                ttl_s=LEASE_TTL_S,
                deadline=deadline,
                poll_s=self.poll_s,
                **ledger_args,
            ),
            method_name="device_granted",
        )

    def device_granted(self, context: Context, event: dict[str, Any]) -> Any:
        if event["status"] != TriggerStatus.GRANTED:
            raise AirflowException(f"tideflow: no device for the evaluation: {event['reason']}")
        lease = None
        if event["device_class"] != "cpu":
            lease = self.hook.ledger().lease_for(self._ledger_args(context)["gang_id"])
            if lease is None:
                raise AirflowException("tideflow: the granted device lease expired")
        return self._evaluate(context, event["preference"], event["device_class"], lease)

    def _checkpoint(self, context: Context) -> tuple[dict[str, Any], Selection | None]:
        """The checkpoint facts for the entry point, and how that checkpoint was chosen."""
        source = self.sources.get("checkpoint")
        if source is None:
            return {}, None
        upstream = checkpoint_facts(context["ti"].xcom_pull(task_ids=source) or {})
        if not upstream.get("checkpoint_store"):
            return upstream, None
        try:
            selection = select_checkpoint(
                str(upstream["checkpoint_store"]),
                self.checkpoint,
                self.keep_best,
                latest=upstream,
                log=self.log.info,
            )
        except StepError as exc:
            raise (AirflowFailException if exc.final else AirflowException)(str(exc)) from exc
        return selection.facts, selection

    def _evaluate(
        self, context: Context, preference: str, device_class: str, lease: Any
    ) -> dict[str, Any]:
        from tideflow.gangs import machine_has

        emulated = not machine_has(device_class)
        env = {
            **{k: str(v) for k, v in self.env.items()},
            "TIDEFLOW_DEVICE_CLASS": device_class,
            "TIDEFLOW_EMULATED": "1" if emulated else "0",
        }
        where = "cpu"
        if lease is not None:
            placement = lease.placements[0]
            where = f"{device_class}:{placement.node}/{','.join(map(str, placement.devices))}"
            if device_class in _VISIBLE:
                env[_VISIBLE[device_class]] = (
                    "" if emulated else ",".join(map(str, placement.devices))
                )
        label = f"{where} ({preference}{', emulated on the CPU' if emulated else ''})"
        self.log.info("tideflow: evaluating on %s", label)
        run_id = track_step(self, context, "evaluation")
        try:
            upstream, selection = self._checkpoint(context)
            if upstream.get("checkpoint"):
                self.log.info("tideflow: evaluating checkpoint %s", upstream["checkpoint"])
            args = entrypoint_args(upstream, self.args)
            outputs = self.run_entrypoint(self.step_context(context), self.entrypoint, args, env)
            try:
                metrics = declared_metrics(self.task_id, self.entrypoint, self.metrics, outputs)
            except StepError as exc:
                raise AirflowException(str(exc)) from exc
        except BaseException:
            finish_tracking(self, run_id, succeeded=False, tags={"tideflow.device": label})
            raise
        finally:
            if lease is not None:
                self.hook.ledger().release(lease.lease_id)
        finish_tracking(
            self,
            run_id,
            succeeded=True,
            metrics=metrics,
            tags={
                "tideflow.device": label,
                "tideflow.checkpoint": str(upstream.get("checkpoint", "")),
                **(selection.tags() if selection is not None else {}),
            },
        )
        for name, value in metrics.items():
            self.log.info("tideflow: %s = %.4f", name, value)
        chosen = {SELECTION_OUTPUT: selection.record()} if selection is not None else {}
        return {"metrics": metrics, "device": label, **upstream, **chosen}
