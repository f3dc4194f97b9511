"""Volcano's admission webhooks for Jobs, reimplemented from their sources.

Each rule is one function citing its upstream file and function (volcano @
ed72c7c, ../shared/reference/upstream/volcano). The Job webhooks answer with a
Status that has only a message, so the API server reports their refusal as 400
BadRequest (k8s.io/apiserver webhook errors ToStatusErr raises codes below 400).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

JOB_MUTATE = "mutatejob.volcano.sh"
JOB_VALIDATE = "validatejob.volcano.sh"

# volcano bus/v1alpha1 events.go and actions.go; the allowed ones are those
# validate/util.go policyEventMap and policyActionMap mark true.
VALID_EVENTS = ["*", "PodFailed", "PodEvicted", "PodPending", "Unknown", "TaskCompleted"]
VALID_EVENTS += ["TaskFailed", "JobUpdated"]
VALID_ACTIONS = ["AbortJob", "RestartJob", "RestartTask", "RestartPod", "RestartPartition"]
VALID_ACTIONS += ["TerminateJob", "CompleteJob", "ResumeJob"]
# volcano pkg/controllers/job/plugins/factory.go registers these builders (from memory of
# the upstream file; it is not in the reference).
PLUGINS = {"env", "svc", "ssh", "tensorflow", "mpi", "pytorch", "ray", "hcclrank"}
_QUALIFIED = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")

Queues = Callable[[], list[dict[str, Any]]]


# -- mutating webhook: mutate/mutate_job.go createPatch -------------------------------------
def mutate_job(job: dict[str, Any], scheduler: str = "volcano") -> dict[str, Any]:
    job = copy.deepcopy(job)
    spec = job.setdefault("spec", {})
    # patchDefaultQueue: an empty queue becomes "default".
    if not spec.get("queue"):
        spec["queue"] = "default"
    # patchDefaultScheduler: the configured scheduler name (volcano).
    if not spec.get("schedulerName"):
        spec["schedulerName"] = scheduler
    # patchDefaultMaxRetry: a maxRetry of 0 (or none) becomes DefaultMaxRetry, 3.
    if not spec.get("maxRetry"):
        spec["maxRetry"] = 3
    # mutateSpec: task names, DNS policy with hostNetwork, task minAvailable and maxRetry.
    for index, task in enumerate(spec.get("tasks") or []):
        if not task.get("name"):
            task["name"] = f"default{index}"
        pod = task.setdefault("template", {}).setdefault("spec", {})
        if pod.get("hostNetwork") and not pod.get("dnsPolicy"):
            pod["dnsPolicy"] = "ClusterFirstWithHostNet"
        if task.get("minAvailable") is None:
            partition = task.get("partitionPolicy") or {}
            if partition.get("minPartitions", 0) > 0:
                task["minAvailable"] = partition["minPartitions"] * partition["partitionSize"]
            else:
                task["minAvailable"] = task.get("replicas", 0)
        if not task.get("maxRetry"):
            task["maxRetry"] = 3
    # patchDefaultMinAvailable: a job minAvailable of 0 is the sum over its tasks.
    if not spec.get("minAvailable"):
        spec["minAvailable"] = sum(t.get("minAvailable", 0) for t in spec.get("tasks") or [])
    # patchDefaultPlugins: the distributed-framework plugins need svc (mpi also ssh).
    plugins = spec.get("plugins")
    if plugins is not None:
        if {"tensorflow", "mpi", "pytorch", "ray"} & set(plugins):
            plugins.setdefault("svc", [])
        if "mpi" in plugins:
            plugins.setdefault("ssh", [])
    return job


# -- validating webhook: validate/admit_job.go validateJobCreate ----------------------------
def is_qualified_name(value: str) -> list[str]:
    """k8s.io/apimachinery validation.IsQualifiedName's messages, for a name without prefix."""
    problems = []
    name = value.split("/", 1)[-1]
    if len(name) > 63:
        problems.append("name part must be no more than 63 characters")
    if not _QUALIFIED.match(name):
        problems.append(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must "
            "start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or "
            "'123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
        )
    return problems


def _multierror(messages: list[str]) -> str:
    """hashicorp/go-multierror's Error() text, which admit_job.go writes into its message."""
    plural = "s" if len(messages) > 1 else ""
    return f"{len(messages)} error{plural} occurred:\n\t* " + "\n\t* ".join(messages) + "\n\n"


def validate_policies(policies: list[dict[str, Any]], path: str) -> str:
    """validate/util.go validatePolicies: event xor exitCode, known events and actions, no
    event or exit code twice, exit code 0 refused, "*" alone."""
    errors: list[str] = []
    events: set[str] = set()
    codes: set[int] = set()
    for policy in policies:
        listed = list(dict.fromkeys((policy.get("events") or []) + [policy.get("event") or ""]))
        listed = [e for e in listed if e]
        if listed and policy.get("exitCode") is not None:
            errors.append("must not specify event and exitCode simultaneously")
            break
        if not listed and policy.get("exitCode") is None:
            errors.append("either event and exitCode should be specified")
            break
        if listed:
            stop = False
            for event in listed:
                if event not in VALID_EVENTS:
                    errors.append(f'{path}: Invalid value: "{event}": invalid policy event')
                    stop = True
                    break
                if policy.get("action") not in VALID_ACTIONS:
                    action = policy.get("action")
                    errors.append(f'{path}: Invalid value: "{action}": invalid policy action')
                    stop = True
                    break
                if event in events:
                    errors.append(f"duplicate event {event}  across different policy")
                    stop = True
                    break
                events.add(event)
            if stop:
                break
        else:
            code = policy["exitCode"]
            if code == 0:
                errors.append("0 is not a valid error code")
                break
            if code in codes:
                errors.append(f"duplicate exitCode {code}")
                break
            codes.add(code)
    if "*" in events and len(events) > 1:
        errors.append("if there's * here, no other policy should be here")
    if not errors:
        return ""
    return (
        _multierror(errors)
        + f" valid events are [{' '.join(VALID_EVENTS)}], valid actions are "
        + f"[{' '.join(VALID_ACTIONS)}];"
    )


def validate_pod_name_length(job: str, task: str, index: int) -> str:
    """admit_job.go validateK8sPodNameLength, on MakePodName(job, task, index) = job-task-index."""
    name = f"{job}-{task}-{index}"
    problems = is_qualified_name(name)
    return (
        f"create pod with name {name} validate failed [{' '.join(problems)}];" if problems else ""
    )


def validate_task_template(task: dict[str, Any], index: int) -> str:
    """admit_job.go validateTaskTemplate: the task's template is a valid core PodTemplate
    (checked here with kubernetes-validate, the schema part of ValidatePodTemplate)."""
    from tests.kubefake.schemas import core_errors

    template = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": task.get("name", "")},
        "template": task.get("template") or {},
    }
    for exc in core_errors(template):
        where = ".".join(str(p) for p in exc.path)
        return f"spec.task[{index}].{where}: {exc.message}. "
    return ""


def validate_job_name(name: str) -> str:
    """admit_job.go validateJobName."""
    problems = is_qualified_name(name)
    return f"create job with name {name} validate failed [{' '.join(problems)}]" if problems else ""


def validate_io(volumes: list[dict[str, Any]]) -> str:
    """validate/util.go validateIO: mount paths set and unique, a claim named or described."""
    seen: set[str] = set()
    for volume in volumes:
        path = volume.get("mountPath", "")
        if not path:
            return " mountPath is required;"
        if path in seen:
            return f" duplicated mountPath: {path};"
        if not volume.get("volumeClaim") and not volume.get("volumeClaimName"):
            return " either VolumeClaim or VolumeClaimName must be specified;"
        seen.add(path)
    return ""


def validate_job_queue(queue_name: str, queues: list[dict[str, Any]]) -> str:
    """admit_job.go validateJobCreate's queue checks: it exists, is Open, is not root and
    is a leaf of the hierarchy."""
    by_name = {q["metadata"]["name"]: q for q in queues}
    queue = by_name.get(queue_name)
    if queue is None:
        return f' unable to find job queue: queue.scheduling.volcano.sh "{queue_name}" not found;'
    message = ""
    state = (queue.get("status") or {}).get("state", "")
    if state != "Open":
        message += (
            f" can only submit job to queue with state `Open`, queue `{queue_name}` "
            f"status is `{state}`;"
        )
    if queue_name == "root":
        return message + " can not submit job to root queue;"
    children = [q for q in queues if (q.get("spec") or {}).get("parent") == queue_name]
    if children:
        message += (
            f" can only submit job to leaf queue, queue `{queue_name}` has "
            f"{len(children)} child queues;"
        )
    return message


def validate_job_create(job: dict[str, Any], queues: Queues) -> str:
    """admit_job.go validateJobCreate: the refusal message, or "" when the job is admitted."""
    spec, name = job.get("spec") or {}, job["metadata"]["name"]
    tasks = spec.get("tasks") or []
    if not tasks:
        return "No task specified in job spec"
    message, names, total = "", set(), 0
    for index, task in enumerate(tasks):
        minimum = task.get("minAvailable")
        if minimum is not None and minimum > task.get("replicas", 0):
            message += (
                f" 'minAvailable' is greater than 'replicas' in task: {task['name']}, job: {name};"
            )
        total += task.get("replicas", 0)
        if task["name"] in names:
            message += f" duplicated task name {task['name']};"
            break
        names.add(task["name"])
        message += validate_policies(task.get("policies") or [], "spec.tasks.policies")
        message += validate_pod_name_length(name, task["name"], index)
        message += validate_task_template(task, index)
    message += validate_job_name(name)
    if total < spec.get("minAvailable", 0):
        message += " job 'minAvailable' should not be greater than total replicas in tasks;"
    message += validate_policies(spec.get("policies") or [], "spec.policies")
    for plugin in spec.get("plugins") or {}:
        if plugin not in PLUGINS:
            message += f" unable to find job plugin: {plugin};"
    message += validate_io(spec.get("volumes") or [])
    message += validate_job_queue(spec.get("queue", ""), queues())
    return message.strip()


def validate_job_update(old: dict[str, Any], new: dict[str, Any]) -> str:
    """admit_job.go validateJobUpdate: only minAvailable, task replicas and the priority
    class may change."""
    old_spec, new_spec = copy.deepcopy(old.get("spec") or {}), copy.deepcopy(new.get("spec") or {})
    if len(old_spec.get("tasks") or []) != len(new_spec.get("tasks") or []):
        return "job updates may not add or remove tasks"
    for spec in (old_spec, new_spec):
        spec.pop("minAvailable", None)
        spec.pop("priorityClassName", None)
        for task in spec.get("tasks") or []:
            task.pop("replicas", None)
            task.pop("minAvailable", None)
    if old_spec != new_spec:
        return (
            "job updates may not change fields other than `minAvailable`, "
            "`tasks[*].replicas under spec` and `PriorityClassName`"
        )
    return ""
