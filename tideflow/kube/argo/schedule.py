"""The pipeline's schedule as an Argo CronWorkflow reads it."""

from __future__ import annotations

from tideflow.kube.argo.context import CompileContext

# Airflow's schedule presets in Argo's cron (robfig/cron): most are the same descriptor;
# "@quarterly" is not one. "@once" and "@continuous" have no CronWorkflow form.
ARGO_SCHEDULES = {
    "@hourly": "@hourly",
    "@daily": "@daily",
    "@weekly": "@weekly",
    "@monthly": "@monthly",
    "@quarterly": "0 0 1 */3 *",
    "@yearly": "@yearly",
}


def argo_schedule(ctx: CompileContext) -> str | None:
    """The schedule in Argo's cron form (cron fields pass as is); None when there is none."""
    schedule = ctx.plan.schedule
    if schedule is None or not schedule.startswith("@"):
        return schedule
    if schedule not in ARGO_SCHEDULES:
        ctx.issue(
            ("metadata", "schedule"),
            f"schedule '{schedule}' has no Argo CronWorkflow form",
            "a cron expression, one of " + ", ".join(ARGO_SCHEDULES) + ", or null "
            "(then submit the WorkflowTemplate yourself)",
        )
        return None
    return ARGO_SCHEDULES[schedule]
