"""What a gang that succeeded leaves: the task's outputs and the end of its MLflow run.

The outputs are ``GangTrainingOperator``'s return value, so its XCom: where the
gang's newest committed checkpoint is (``tideflow.gangs.outputs``), its restarts
and device-hours. The step's MLflow run gets the records the gang could not deliver
while MLflow was down, the gang's state, checkpoint and device-hours, and on the
local lease ledger those device-hours split by quota.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowFailException

from tideflow.operators.base import TideflowOperator, finish_tracking

if TYPE_CHECKING:
    from tideflow.backends.protocol import GangStatus
    from tideflow.gangs import ResolvedGang
    from tideflow.gangs.outputs import GangOutputs


def step_outputs(
    gang: ResolvedGang, status: GangStatus, warn: Callable[[str], None]
) -> GangOutputs:
    """The task's return value: the gang's outputs, its restarts and device-hours."""
    from tideflow.gangs.outputs import NoCheckpointError, gang_outputs

    try:
        outputs = gang_outputs(gang, warn=warn)
    except NoCheckpointError as exc:
        # Retrying would run the same script to the same end: fail for good.
        raise AirflowFailException(f"tideflow: {exc}") from None
    outputs["restarts"] = status.restarts
    outputs["device_hours"] = status.device_seconds / 3600
    return outputs


def record_gang_run(
    operator: TideflowOperator,
    context: Context,
    status: GangStatus,
    outputs: GangOutputs,
    *,
    device_class: str,
    usage_tags: Callable[[], dict[str, str]] | None,
) -> None:
    """Close the step's MLflow run with what the gang did; ``usage_tags`` (None on the
    cluster, where no lease ledger counts device-hours) adds their split by quota."""
    from tideflow.tracking import tracking_enabled

    run_id = context["ti"].xcom_pull(task_ids=operator.task_id, key="mlflow_run_id")
    if not tracking_enabled() or not run_id:
        return
    try:  # metrics the gang could not deliver while MLflow was down
        from tideflow.tracking.spool import flush_spool

        delivered = flush_spool(run_id)
        if delivered:
            operator.log.info("tideflow: delivered %d buffered MLflow record(s)", delivered)
    except Exception as exc:
        operator.log.warning("tideflow: buffered MLflow records not delivered yet: %s", exc)
    tags = {"tideflow.gang_state": str(status.state), "tideflow.restarts": str(status.restarts)}
    if outputs.get("checkpoint"):
        tags["tideflow.checkpoint"] = str(outputs["checkpoint"])
        tags["tideflow.checkpoint_checksum"] = str(outputs.get("checkpoint_checksum"))
    if usage_tags is not None:
        tags.update(usage_tags())
    finish_tracking(
        operator,
        run_id,
        succeeded=str(status.state) == "succeeded",
        tags=tags,
        metrics={
            f"{device_class}_hours": status.device_seconds / 3600,
            "restarts": float(status.restarts),
        },
    )


def ledger_usage_tags(operator: TideflowOperator, gang_id: str) -> dict[str, str]:
    """The gang's device-hours from the ledger, on its own quota, borrowed and lost to
    preemption (every attempt of this step's gang), for the run's cost attribution."""
    from tideflow.scheduling.accounting import gang_usage

    try:
        split = gang_usage(operator.hook.ledger().usage_spans(0.0), gang_id)
    except Exception as exc:  # accounting must never fail a finished gang
        operator.log.warning("tideflow: device-hours not read from the ledger: %s", exc)
        return {}
    return {
        "tideflow.device_hours.own": f"{split.own_hours:.6f}",
        "tideflow.device_hours.borrowed": f"{split.borrowed_hours:.6f}",
        "tideflow.device_hours.lost": f"{split.lost_hours:.6f}",
    }
