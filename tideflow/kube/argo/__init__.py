"""A pipeline as an Argo WorkflowTemplate, as plain data (pure; ``tideflow.argo`` builds it).

One DAG template runs one task per step, with the Airflow DAG's dependencies
(both come from the same ``DagPlan``). Each step is a template of its own:

* data_prep, evaluation, promote_checkpoint: a container running the
  standalone executor (``python -m tideflow.steps.standalone``) in the platform
  image. It calls the step's entry point as the operators do and writes each
  output to a file under ``OUTPUTS_DIR``, which Argo reads as an output parameter.
* gang_training: a container running tideflow's gang driver
  (``python -m tideflow.gangs.driver``) with the same arguments. It resolves
  the gang as the operator does, creates its Volcano Job or JobSet (owned by
  the workflow), follows it to its end, resubmits it when it is preempted, and
  deletes it when the step is stopped (its deadline, ``argo stop``). Its
  outputs say where the checkpoints are. The gang carries the class the
  operator would give it: the run's (the workflow's ``priority_class``
  parameter), else its team's default, checked against the cluster file the
  workflow was compiled with.

Every pod of the workflow runs as ``argo_service_account`` with no API token
mounted; Argo's own executor containers (they report outputs) get the token of
``argo_executor_service_account``, and the gang driver alone that of
``argo_gang_driver_service_account``. Steps that report to MLflow carry the
label its NetworkPolicy admits; the driver does not.

Templates in the pipeline become Argo's (``tideflow.compile.templates``): a
param is a workflow parameter; an upstream output is an input parameter that
the DAG task fills from that task's output parameter. Evaluation and promotion
read the gang's checkpoint store from the gang step's output, so the store has
one rule (``tideflow.gangs.resolve_gang``), applied where the gang runs.

Known limits, refused or documented rather than compiled wrongly: an
evaluation runs on one device kind (the first of its preferences the cluster
inventory has, or the first), not on whichever is free when it starts; a gang
step needs a command entry point, as on the Kubernetes backend; a pipeline's
schedule is not part of the template (a CronWorkflow can submit it).

The modules, one concern each:

* ``plan``: the result, as data (``WorkflowPlan``, ``StepTemplate``, ``WorkflowParam``);
* ``compiler``: ``compile_workflow``, which runs one builder per step kind;
* ``context``: what the builders share: the pipeline, its tasks, the problems found;
* ``templating``: the pipeline's ``{{ ... }}`` templates in Argo's syntax;
* ``parameters``: workflow parameters, their names, text and types;
* ``container``: the standalone executor's container, shared by the container steps;
* ``data_prep_step``, ``evaluation_step``, ``promotion_step``, ``gang_step``,
  ``exit_step``: one builder per kind of template;
* ``schedule``: the CronWorkflow's cron;
* ``team_classes``: the cluster file's classes and the team, for the gang driver.
"""

from tideflow.kube.argo.compiler import compile_workflow
from tideflow.kube.argo.plan import (
    OUTPUTS_DIR,
    WORKFLOW_NAME,
    StepTemplate,
    WorkflowParam,
    WorkflowPlan,
)

__all__ = [
    "OUTPUTS_DIR",
    "WORKFLOW_NAME",
    "StepTemplate",
    "WorkflowParam",
    "WorkflowPlan",
    "compile_workflow",
]
