"""A pipeline as an Argo WorkflowTemplate, as plain data (pure; ``tideflow.argo`` builds it).

One DAG template runs one task per step, with the Airflow DAG's dependencies
(both come from the same ``DagPlan``). Each step is a template of its own:

* data_prep, evaluation, promote_checkpoint: a container running the
  standalone executor (``python -m tideflow.steps.standalone``) in the platform
  image. It calls the step's entry point as the operators do and writes each
  output to a file under ``OUTPUTS_DIR``, which Argo reads as an output parameter.
* gang_training: a ``resource`` template that creates the step's Volcano Job
  (owned by the workflow, so deleting the workflow deletes the gang) and waits
  for Volcano's verdict on the whole gang. Argo substitutes ``{{...}}`` in the
  manifest text before it creates the object, so the gang's size may be a
  workflow parameter; integer fields are written unquoted for that reason.

Every pod of the workflow runs as ``argo_service_account`` with no API token
mounted; Argo's own executor containers (they report outputs and create the
gang) get the token of ``argo_executor_service_account``. Steps that report to
MLflow carry the label its NetworkPolicy admits; the resource step does not.

Templates in the pipeline become Argo's (``tideflow.compile.templates``): a
param is a workflow parameter; an upstream output is an input parameter that
the DAG task fills from that task's output parameter. The gang's checkpoint
store is derived from the workflow's name and the step, so evaluation and
promotion find the newest committed checkpoint there; nothing has to come out
of the Volcano Job.

Known limits, refused or documented rather than compiled wrongly: an
evaluation runs on one device kind (the first of its preferences the cluster
inventory has, or the first), not on whichever is free when it starts; a gang
step needs a command entry point, as on the Kubernetes backend; a pipeline's
schedule is not part of the template (a CronWorkflow can submit it).

The modules, one concern each:

* ``plan``: the result, as data (``WorkflowPlan``, ``StepTemplate``, ``WorkflowParam``);
* ``compiler``: ``compile_workflow``, which runs one builder per step kind;
* ``context``: what the builders share: the pipeline, its tasks, the problems found;
* ``templating``: the pipeline's ``{{ ... }}`` templates in Argo's syntax, and where a
  gang's checkpoints are;
* ``parameters``: workflow parameters, their names, text and types;
* ``container``: the standalone executor's container, shared by the container steps;
* ``data_prep_step``, ``evaluation_step``, ``promotion_step``, ``gang_step``,
  ``exit_step``: one builder per kind of template;
* ``manifest``: a resource template's YAML; ``schedule``: the CronWorkflow's cron.
"""

from tideflow.kube.argo.compiler import compile_workflow
from tideflow.kube.argo.plan import (
    FAILURE,
    OUTPUTS_DIR,
    SUCCESS,
    WORKFLOW_NAME,
    StepTemplate,
    WorkflowParam,
    WorkflowPlan,
)

__all__ = [
    "FAILURE",
    "OUTPUTS_DIR",
    "SUCCESS",
    "WORKFLOW_NAME",
    "StepTemplate",
    "WorkflowParam",
    "WorkflowPlan",
    "compile_workflow",
]
