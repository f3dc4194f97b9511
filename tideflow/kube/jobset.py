"""A gang step as a JobSet admitted by Kueue: the alternative to a Volcano Job.

Kueue admits a workload whole or not at all (its quota covers every pod), and
JobSet restarts the whole gang when one worker fails, which a plain batch Job
cannot (it would restart only the failed index while the other ranks wait in a
collective). So a gang is one JobSet with one replicated Job:

* an Indexed Job with ``parallelism`` = ``completions`` = workers; each pod's
  ``JOB_COMPLETION_INDEX`` is its rank, and ``backoffLimit: 0`` turns any pod
  failure into a Job failure, which JobSet answers by recreating every worker
  (``failurePolicy.maxRestarts`` = the step's ``max_restarts``); workers resume
  from the newest committed checkpoint;
* exit 76 (the training-health guard) matches a pod failure policy rule, and
  the JobSet fails at once instead of restarting a diverging run;
* ``network.enableDNSHostnames`` gives worker 0 a stable host name for
  ``MASTER_ADDR``;
* the ``kueue.x-k8s.io/queue-name`` label names the team's LocalQueue; the pods'
  PriorityClass is the workload's priority (Kueue reads it from the pod template).
"""

from __future__ import annotations

from typing import Any

from tideflow.compile.dag_plan import DagPlan, TaskPlan
from tideflow.kube.names import dns_label
from tideflow.kube.pods import MLFLOW_CLIENT_LABELS
from tideflow.kube.volcano import (
    EXIT_UNHEALTHY,
    GangShape,
    KubeSettings,
    gang_labels,
    gang_pod_spec,
    gang_shape,
)

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
REPLICATED_JOB = "worker"


def jobset(plan: DagPlan, task: TaskPlan, *, run_id: str, settings: KubeSettings) -> dict[str, Any]:
    """The JobSet of a compiled, rendered gang step of one DAG run."""
    shape, gang_id = gang_shape(plan, task, run_id=run_id, settings=settings)
    return gang_jobset(shape, gang_id, settings)


def gang_jobset(shape: GangShape, gang_id: str, settings: KubeSettings) -> dict[str, Any]:
    """The JobSet for a gang of ``shape.workers`` pods, admitted whole by Kueue."""
    name = shape.name
    labels = gang_labels(shape, gang_id)
    # Pod host names are <jobset>-<replicated job>-<job index>-<pod index>.<subdomain>.
    master = f"{name}-{REPLICATED_JOB}-0-0.{name}"
    pod_spec = gang_pod_spec(shape, settings, master_addr=master)
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "parallelism": shape.workers,
        "completions": shape.workers,
        "backoffLimit": 0,
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {
                        "containerName": "worker",
                        "operator": "In",
                        "values": [EXIT_UNHEALTHY],
                    },
                }
            ]
        },
        "template": {"metadata": {"labels": {**labels, **MLFLOW_CLIENT_LABELS}}, "spec": pod_spec},
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": {**labels, QUEUE_LABEL: dns_label(shape.team)},
        },
        "spec": {
            "network": {"enableDNSHostnames": True, "subdomain": name},
            "successPolicy": {"operator": "All"},
            "failurePolicy": {
                "maxRestarts": shape.max_restarts,
                "rules": [
                    # Only the health guard's exit matches the pod failure policy;
                    # every other failure (eviction, preemption, a crash) restarts.
                    {
                        "name": "unhealthy-training",
                        "action": "FailJobSet",
                        "onJobFailureReasons": ["PodFailurePolicy"],
                    }
                ],
            },
            "replicatedJobs": [
                {"name": REPLICATED_JOB, "replicas": 1, "template": {"spec": job_spec}}
            ],
        },
    }
