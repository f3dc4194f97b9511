"""A gang step as a JobSet admitted by Kueue: the alternative to a Volcano Job.

Kueue admits a workload whole or not at all (its quota covers every pod), and
JobSet restarts the whole gang when one worker fails, which a plain batch Job
cannot (it would restart only the failed index while the other ranks wait in a
collective). So a gang is one JobSet with one replicated Job:

* an Indexed Job with ``parallelism`` = ``completions`` = workers; each pod's
  completion index is its ``RANK`` (torchrun's environment,
  ``tideflow.kube.torchrun``), and ``backoffLimit: 0`` turns any pod
  failure into a Job failure, which JobSet answers by recreating every worker
  (``failurePolicy.maxRestarts`` = the step's ``max_restarts``); workers resume
  from the newest committed checkpoint;
* exit 76 (the training-health guard) matches a pod failure policy rule, and
  the JobSet fails at once instead of restarting a diverging run; a pod that
  is evicted or preempted (``DisruptionTarget``) matches another, and the
  JobSet restarts without counting it against ``maxRestarts``;
* ``network.enableDNSHostnames`` gives worker 0 a stable host name for
  ``MASTER_ADDR``;
* the ``kueue.x-k8s.io/queue-name`` label names the team's LocalQueue. A gang of a
  cluster file's priority class carries the label ``kueue.x-k8s.io/priority-class``
  naming the WorkloadPriorityClass ``tideflow compile --target kueue`` made of it:
  Kueue reads it from the JobSet's own labels (kueue pkg/controller/jobframework/
  utils.go WorkloadPriorityClassName) and it decides the workload's priority, while
  the pods keep the PriorityClass their priority maps to (site/content/en/docs/
  concepts/workload_priority_class.md). Without a class the pods' PriorityClass is
  the workload's priority too (Kueue reads it from the pod template).
"""

from __future__ import annotations

from typing import Any

from tideflow.compile.team_queues import priority_class_name
from tideflow.kube.names import dns_label
from tideflow.kube.pods import MLFLOW_CLIENT_LABELS
from tideflow.kube.settings import KubeSettings
from tideflow.kube.torchrun import JOBSET
from tideflow.kube.volcano import (
    EXIT_UNHEALTHY,
    GangShape,
    gang_object_labels,
    gang_pod_spec,
    step_file_annotations,
)

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# kueue pkg/controller/constants/constants.go WorkloadPriorityClassLabel
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
REPLICATED_JOB = "worker"


def _pod_template(
    shape: GangShape, gang_id: str, settings: KubeSettings, labels: dict[str, str]
) -> dict[str, Any]:
    """Each worker's pod template: the gang's pod spec, its labels and step-file annotations."""
    name = shape.name
    # Pod host names are <jobset>-<replicated job>-<job index>-<pod index>.<subdomain>.
    master = f"{name}-{REPLICATED_JOB}-0-0.{name}"
    pod_spec = gang_pod_spec(shape, settings, master_addr=master, index=JOBSET, run_id=gang_id)
    template_meta: dict[str, Any] = {"labels": {**labels, **MLFLOW_CLIENT_LABELS}}
    if shape.step_files:  # the step's context files, made by the pod's downward-API volume
        template_meta["annotations"] = step_file_annotations(shape)
    return {"metadata": template_meta, "spec": pod_spec}


def _pod_failure_policy() -> dict[str, Any]:
    """The Job's pod failure rules; their indexes are what the JobSet's rules match."""
    return {
        "rules": [
            # Rule 0: the health guard's exit fails the Job at once ...
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": "worker",
                    "operator": "In",
                    "values": [EXIT_UNHEALTHY],
                },
            },
            # ... rule 1: a pod evicted or preempted (Kueue, the broker, a drained
            # node) carries the DisruptionTarget condition.
            {
                "action": "FailJob",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            },
        ]
    }


def _job_spec(shape: GangShape, template: dict[str, Any]) -> dict[str, Any]:
    """The Indexed Job of ``shape.workers`` pods that any pod failure fails."""
    return {
        "completionMode": "Indexed",
        "parallelism": shape.workers,
        "completions": shape.workers,
        "backoffLimit": 0,
        "podFailurePolicy": _pod_failure_policy(),
        "template": template,
    }


def _jobset_labels(shape: GangShape, labels: dict[str, str]) -> dict[str, str]:
    """The gang's labels plus Kueue's queue and, with a class, its priority class."""
    jobset_labels = {**labels, QUEUE_LABEL: dns_label(shape.team)}
    if shape.priority_class:
        jobset_labels[PRIORITY_CLASS_LABEL] = priority_class_name(shape.priority_class)
    return jobset_labels


def _jobset_failure_policy(max_restarts: int) -> dict[str, Any]:
    """Fail the JobSet on an unhealthy run; restart a preempted gang without counting it."""
    return {
        "maxRestarts": max_restarts,
        # The first rule whose reason and message pattern match the failed Job
        # applies; no match restarts the gang and counts against maxRestarts
        # (jobset site/content/en/docs/tasks/failure_policy.md). A Job failed by
        # a pod failure policy rule says which rule in its message (batch/v1
        # Job controller: "... matching FailJob rule at index N").
        "rules": [
            {
                "name": "unhealthyTraining",
                "action": "FailJobSet",
                "onJobFailureReasons": ["PodFailurePolicy"],
                "onJobFailureMessagePatterns": [".*FailJob rule at index 0.*"],
            },
            # A preemption restarts the gang from its checkpoint without using up
            # a restart, as upstream's host-maintenance example does
            # (site/static/examples/failure-policy/host-maintenance-event-model.yaml).
            {
                "name": "preempted",
                "action": "RestartJobSetAndIgnoreMaxRestarts",
                "onJobFailureReasons": ["PodFailurePolicy"],
                "onJobFailureMessagePatterns": [".*FailJob rule at index 1.*"],
            },
        ],
    }


def gang_jobset(shape: GangShape, gang_id: str, settings: KubeSettings) -> dict[str, Any]:
    """The JobSet for a gang of ``shape.workers`` pods, admitted whole by Kueue."""
    name = shape.name
    labels = gang_object_labels(shape, gang_id)
    job_spec = _job_spec(shape, _pod_template(shape, gang_id, settings, labels))
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": _jobset_labels(shape, labels),
        },
        "spec": {
            "network": {"enableDNSHostnames": True, "subdomain": name},
            "successPolicy": {"operator": "All"},
            "failurePolicy": _jobset_failure_policy(shape.max_restarts),
            "replicatedJobs": [
                {"name": REPLICATED_JOB, "replicas": 1, "template": {"spec": job_spec}}
            ],
        },
    }
