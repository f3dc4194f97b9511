"""Argo Workflows through hera: the edge that builds a compiled ``WorkflowPlan``.

The decisions are made in the core (``tideflow.kube.argo``, hera-free and
pure); this package only maps them onto hera's objects, which emit the
WorkflowTemplate. It imports neither Airflow nor the Airflow layer.
"""

from tideflow.argo.workflow import (
    compile_pipeline,
    cron_workflow,
    render,
    render_cron,
    workflow_template,
    write,
)

__all__ = [
    "compile_pipeline",
    "cron_workflow",
    "render",
    "render_cron",
    "workflow_template",
    "write",
]
