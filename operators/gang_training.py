"""``GangTrainingOperator``: all workers start together or none do, and waiting is deferred.

Flow of one task try:
  execute  -> a gang with this id already running? reattach (never a second copy)
           -> lease granted at once? start the gang; else defer to LeaseTrigger
  lease_granted  -> start the gang through the backend, defer to GangTrigger
  gang_finished  -> succeeded: release the lease, return the checkpoint
                    (outputs and the MLflow run's end: gang_results);
                    preempted: release, wait for devices again, resume;
                    failed: release and fail the task with the gang's reason
A retried task recomputes the same gang id, so it reattaches to a gang that is
still running, or resumes from the newest committed checkpoint.

With ``TIDEFLOW_BACKEND=kubernetes`` the cluster's gang scheduler (Volcano or
Kueue) admits and places the gang instead of the lease ledger:
  execute  -> the gang's object exists? reattach; else create it once;
              defer to ClusterGangTrigger
  gang_finished -> as above (the gang scheduler restarts evicted gangs itself)
"""

from __future__ import annotations

import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from tideflow.operators.base import TideflowOperator, track_step
from tideflow.operators.gang_results import ledger_usage_tags, record_gang_run, step_outputs
from tideflow.operators.triggers import ClusterGangTrigger, GangTrigger, LeaseTrigger, TriggerStatus

if TYPE_CHECKING:
    from tideflow.compile.gang_plan import GangStepPlan
    from tideflow.gangs import ResolvedGang
    from tideflow.inventory import Inventory
    from tideflow.operators.triggers import GangEvent, LeaseEvent, ResumeKwargs

DEFAULT_WAIT_S = 7 * 24 * 3600


class GangTrainingOperator(TideflowOperator):
    template_fields = (
        "entrypoint",
        "args",
        "env",
        "workers",
        "min_workers",
        "devices_per_worker",
        "max_restarts",
        "checkpoint",
        "priority_class",
    )
    template_fields_renderers = {"args": "json", "env": "json", "checkpoint": "json"}
    ui_color = "#f9e79f"

    def __init__(
        self,
        *,
        plan: GangStepPlan,
        lease_poll_s: float = 5.0,
        gang_poll_s: float = 2.0,
        wait_timeout_s: float = DEFAULT_WAIT_S,
        **kwargs: Any,
    ) -> None:
        from tideflow.compile.gang_plan import checkpoint_to_json

        super().__init__(**kwargs)
        # The step's plan (tideflow.compile.gang_plan). Airflow renders each templated
        # field on its own, so those are attributes of their own, taken from the plan;
        # ``step_plan`` puts the rendered values back.
        self.plan = plan
        entrypoint = plan.entrypoint
        self.entrypoint = entrypoint if isinstance(entrypoint, str) else list(entrypoint)
        self.args = dict(plan.args)
        self.env = dict(plan.env)
        self.workers = plan.workers
        self.min_workers = plan.min_workers
        self.devices_per_worker = plan.devices_per_worker
        self.max_restarts = plan.max_restarts
        self.checkpoint = checkpoint_to_json(plan.checkpoint)
        self.priority_class = plan.priority_class
        self.lease_poll_s = lease_poll_s
        self.gang_poll_s = gang_poll_s
        self.wait_timeout_s = wait_timeout_s

    # -- helpers ---------------------------------------------------------------
    def _gang_id(self, context: Context) -> str:
        from tideflow.gangs import gang_id_for

        return gang_id_for(self.dag_id, context["run_id"], self.task_id)

    def step_plan(self) -> GangStepPlan:
        """The step's plan with its rendered fields put back."""
        from tideflow.compile.gang_plan import checkpoint_from_json

        entrypoint = self.entrypoint
        return replace(
            self.plan,
            entrypoint=entrypoint if isinstance(entrypoint, str) else tuple(map(str, entrypoint)),
            args=self.args,
            env=self.env,
            workers=self.workers,
            min_workers=self.min_workers,
            devices_per_worker=self.devices_per_worker,
            max_restarts=self.max_restarts,
            checkpoint=checkpoint_from_json(self.checkpoint),
            priority_class=self.priority_class,
        )

    def _gang(self, context: Context, classes: Inventory | None = None) -> ResolvedGang:
        """This step's gang in this run (``tideflow.gangs.resolve_gang``): one rule for its
        id, checkpoint store, environment and, with the cluster file's ``classes``, its
        priority, wherever it runs."""
        from tideflow.gangs import PriorityClassError, resolve_gang
        from tideflow.storage.roots import StoreRootError

        settings = self.hook.settings()
        try:
            return resolve_gang(
                self.step_plan(),
                pipeline=self.dag_id,
                team=self.team,
                run_id=context["run_id"],
                step=self.task_id,
                artifact_root=settings.artifact_root,
                allowed_roots=settings.checkpoint_roots_for(self.team),
                code_path=self.code_path,
                classes=classes,
            )
        except (StoreRootError, PriorityClassError) as exc:
            raise AirflowFailException(f"tideflow: step '{self.task_id}': {exc}") from None

    def _on_cluster(self) -> bool:
        return self.hook.on_cluster()

    def _paths(self) -> tuple[Path, Path, str | None]:
        settings = self.hook.settings()
        return settings.ledger_path, settings.gangs_dir, settings.cluster

    def _deadline(self, context: Context) -> float:
        """When this try gives up: its ``timeout`` (``execution_timeout``), or the wait limit.

        Absolute, so a trigger resumed after a triggerer restart keeps its limit, and
        carried from trigger to trigger (``_carried_deadline``) so that waiting for
        devices, running and resuming after a preemption share one limit.
        """
        carried = getattr(self, "_carried_deadline", None)
        if carried is not None:
            return float(carried)
        start = context["ti"].start_date
        base = start.timestamp() if start is not None else time.time()
        deadline = base + self.wait_timeout_s
        if self.execution_timeout is not None:
            deadline = min(deadline, base + self.execution_timeout.total_seconds())
        self._carried_deadline = deadline
        return deadline

    def _timed_out_message(self, what: str) -> str:
        limit = self.execution_timeout
        if limit is None:
            return f"tideflow: {what} after waiting {self.wait_timeout_s:.0f}s"
        return f"tideflow: step '{self.task_id}' ran past its timeout ({limit}): {what}"

    def _stop_gang(self, gang_id: str) -> str:
        """Stop the gang (workers, supervisor or cluster object) and free its lease."""
        from tideflow.backends.local import LocalBackend
        from tideflow.gangs.control import stop_gang

        if self._on_cluster():
            self.hook.cluster_backend().cancel(gang_id)
            return f"gang {gang_id} deleted"
        _, state_dir, _ = self._paths()
        # its lease is freed only once none of its processes runs (gangs.control)
        return stop_gang(gang_id, self.hook.ledger(), LocalBackend(state_dir))

    def resume_execution(
        self, next_method: str, next_kwargs: ResumeKwargs | None, context: Context
    ) -> Any:
        """Airflow's own deferral timeout (the scheduler fails a deferred task whose
        ``execution_timeout`` passed) stops the gang too, before the task fails."""
        from airflow.sdk.bases.operator import TRIGGER_FAIL_REPR, TriggerFailureReason

        error = (next_kwargs or {}).get("error")
        if next_method == TRIGGER_FAIL_REPR and error == TriggerFailureReason.TRIGGER_TIMEOUT:
            self.log.error("%s", self._timed_out_message(self._stop_gang(self._gang_id(context))))
        event = (next_kwargs or {}).get("event")
        if isinstance(event, dict) and event.get("deadline") is not None:
            self._carried_deadline = float(event["deadline"])
        return super().resume_execution(next_method, next_kwargs, context)

    # -- Airflow entry points ----------------------------------------------------
    def execute(self, context: Context) -> Any:
        from tideflow.backends.local import LocalBackend
        from tideflow.gangs import enforce_evictions, holder_name, request_to_dict
        from tideflow.scheduling import Lease

        if self._on_cluster():
            return self._execute_on_cluster(context)
        gang_id = self._gang_id(context)
        ledger_path, state_dir, cluster = self._paths()
        running = LocalBackend(state_dir).reattach(gang_id)
        if running is not None:
            self.log.info(
                "tideflow: gang %s is already running (%s); reattaching instead of "
                "starting a second copy",
                gang_id,
                running.state,
            )
            return self._defer_to_gang(context, gang_id)
        ledger = self.hook.ledger()
        # its priority from the cluster file's class (if any)
        request = self._gang(context, ledger.inventory).request()
        result = ledger.try_acquire(request, holder_name(), 300.0)
        if isinstance(result, Lease):
            return self._start(context, result)
        if result.never:
            raise AirflowFailException(f"tideflow: gang can never be placed: {result.reason}")
        for step in enforce_evictions(ledger, LocalBackend(state_dir)):
            self.log.info("tideflow: eviction of %s: %s %s", step.gang_id, step.action, step.detail)
        self.log.info("tideflow: waiting for devices without holding any: %s", result.reason)
        self.defer(
            trigger=LeaseTrigger(
                request=request_to_dict(request),
                ledger_path=str(ledger_path),
                cluster_file=cluster,
                holder=holder_name(),
                ttl_s=300.0,
                deadline=self._deadline(context),
                poll_s=self.lease_poll_s,
                state_dir=str(state_dir),
            ),
            method_name="lease_granted",
        )

    def lease_granted(self, context: Context, event: LeaseEvent) -> Any:
        if event["status"] == TriggerStatus.NEVER:
            raise AirflowFailException(f"tideflow: gang can never be placed: {event['reason']}")
        if event["status"] == TriggerStatus.TIMEOUT:
            raise AirflowException(
                self._timed_out_message(f"still waiting for devices ({event['reason']})")
            )
        lease = self.hook.ledger().lease_for(self._gang_id(context))
        if lease is None:
            raise AirflowException("tideflow: the granted lease expired before the gang started")
        return self._start(context, lease)

    def _start(self, context: Context, lease: Any) -> Any:
        from tideflow.backends.local import LocalBackend
        from tideflow.gangs import build_job

        ledger_path, state_dir, _ = self._paths()
        ctx = self.step_context(context)
        gang = self._gang(context)
        env = self._tracking_env(context, ctx)
        if lease.min_workers is not None:  # elastic: it may resume on another worker count
            env["TIDEFLOW_MIN_WORKERS"] = str(lease.min_workers)
            if lease.workers < int(self.workers):
                self.log.info(
                    "tideflow: elastic gang starts with %d of %s worker(s) (minimum %d)",
                    lease.workers,
                    self.workers,
                    lease.min_workers,
                )
        command, files = self._command(gang, ctx, state_dir / "contexts")
        env.update(files)
        job = build_job(gang, lease, command=command, extra_env=env, ledger_path=ledger_path)
        placement = "; ".join(f"rank {s.rank} -> {s.node}{list(s.devices)}" for s in job.slots)
        self.log.info("tideflow: lease %s granted: %s", lease.lease_id, placement)
        LocalBackend(state_dir).submit(job)
        return self._defer_to_gang(context, job.gang_id)

    def _execute_on_cluster(self, context: Context) -> Any:
        from tideflow.inventory import inventory_for

        gang_id = self._gang_id(context)
        backend = self.hook.cluster_backend()
        running = backend.reattach(gang_id)
        if running is not None:
            self.log.info(
                "tideflow: gang %s already exists on the cluster (%s); reattaching",
                gang_id,
                running.state,
            )
            return self._defer_to_cluster_gang(context, gang_id)
        if isinstance(self.entrypoint, str):
            raise AirflowFailException(
                f"tideflow: step '{self.task_id}': entry point {self.entrypoint!r} is "
                "module:function; on Kubernetes a gang step needs a command entry point "
                "(a list such as [python, -m, my.module])"
            )
        ctx = self.step_context(context)
        _, _, cluster = self._paths()
        # the class the cluster file gives it, as on the local ledger
        gang = self._gang(context, None if cluster is None else inventory_for(cluster))
        job = gang.cluster_job(self._tracking_env(context, ctx), context=ctx)
        status = backend.submit(job)
        self.log.info(
            "tideflow: gang %s submitted to %s as %s/%s (%d worker(s)): %s",
            gang_id,
            backend.settings.gang_scheduler,
            backend.settings.namespace,
            backend.job_name(gang_id),
            job.workers,
            status.state,
        )
        return self._defer_to_cluster_gang(context, gang_id)

    def _defer_to_cluster_gang(self, context: Context, gang_id: str) -> None:
        self.defer(
            trigger=ClusterGangTrigger(gang_id=gang_id, deadline=self._deadline(context)),
            method_name="gang_finished",
        )

    def _tracking_env(self, context: Context, ctx: Any) -> dict[str, str]:
        """MLflow runs for this DAG run and step; rank 0 of the gang logs into the step's run."""
        run_id = track_step(self, context, "gang_training")
        return {} if run_id is None else {"MLFLOW_RUN_ID": run_id}

    def _command(self, gang: Any, ctx: Any, scratch: Path) -> tuple[list[str], dict[str, str]]:
        """The workers' command line and their step-context files (``local_command``)."""
        from tideflow.gangs import local_command
        from tideflow.storage import safe_segment

        directory = scratch / safe_segment(f"{ctx.dag_id}-{ctx.run_id}-{ctx.step}")
        return local_command(gang, ctx, directory)

    def _defer_to_gang(self, context: Context, gang_id: str) -> None:
        _, state_dir, _ = self._paths()
        self.defer(
            trigger=GangTrigger(
                gang_id=gang_id,
                state_dir=str(state_dir),
                deadline=self._deadline(context),
                poll_s=self.gang_poll_s,
            ),
            method_name="gang_finished",
        )

    def gang_finished(self, context: Context, event: GangEvent) -> Any:
        from tideflow.backends.protocol import GangState, GangStatus

        gang_id = self._gang_id(context)
        ledger = None if self._on_cluster() else self.hook.ledger()
        lease = ledger.lease_for(gang_id) if ledger is not None else None
        if event["status"] == TriggerStatus.UNKNOWN:
            raise AirflowException(f"tideflow: the backend does not know gang {gang_id}")
        status = GangStatus.from_json(event["gang"])
        if event["status"] == TriggerStatus.TIMEOUT:
            raise AirflowException(self._timed_out_message(self._stop_gang(gang_id)))
        if ledger is not None and lease is not None:
            self._release(gang_id, lease)
        self.log.info(
            "tideflow: gang %s %s after %d restart(s), %.3f device-hours",
            gang_id,
            status.state,
            status.restarts,
            status.device_seconds / 3600,
        )
        if status.state is GangState.SUCCEEDED:
            outputs = step_outputs(self._gang(context), status, self.log.warning)
            record_gang_run(
                self,
                context,
                status,
                outputs,
                device_class=self.plan.device_class,
                usage_tags=None if ledger is None else partial(ledger_usage_tags, self, gang_id),
            )
            return outputs
        if status.state is GangState.PREEMPTED:
            self.log.info(
                "tideflow: gang preempted after a checkpoint; waiting for devices to resume"
            )
            return self.execute(context)
        raise AirflowException(
            f"tideflow: gang {status.state}: {status.message} (restarts: {status.restarts})"
        )

    def _release(self, gang_id: str, lease: Any) -> None:
        """Free the ended gang's lease, once none of its processes runs: the workers
        of a supervisor that died outlive it, and are killed first."""
        from tideflow.backends.local import LocalBackend

        _, state_dir, _ = self._paths()
        if LocalBackend(state_dir).kill(gang_id):
            self.hook.ledger().release(lease.lease_id)
        else:
            self.log.warning(
                "tideflow: some processes of gang %s would not die: its lease is kept "
                "until it expires",
                gang_id,
            )
