"""The JobSet webhook and Kueue's JobSet webhook, reimplemented from their sources.

* JobSet (kubernetes-sigs/jobset @ 08dfbdf, pkg/webhooks/jobset_webhook.go): Default
  and ValidateCreate / ValidateUpdate. Its refusals are ``apierrors.NewInvalid``:
  422 Invalid, ``JobSet.jobset.x-k8s.io "<name>" is invalid: ...``; plain errors
  inside are wrapped as ``<nil>: Internal error: ...`` (toFieldErrorList).
* Kueue (kubernetes-sigs/kueue @ ff69552, pkg/controller/jobs/jobset/jobset_webhook.go):
  Default suspends a JobSet that names a LocalQueue (jobframework/defaults.go
  ApplyDefaultForSuspend, WorkloadShouldBeSuspended in jobframework/utils.go) and
  ValidateCreate checks the queue-name label. Its refusals are plain errors,
  which controller-runtime answers with ``admission.Denied``: 403 Forbidden.

Both webhooks are named ``vjobset.kb.io`` / ``mjobset.kb.io`` upstream.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from tests.kubefake.status import ApiError, webhook_denied

JOBSET_VALIDATE = "vjobset.kb.io"
JOBSET_MUTATE = "mjobset.kb.io"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # kueue pkg/controller/constants QueueLabel

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
# jobset_webhook.go ruleNameFmt, minRuleNameLength, maxRuleNameLength
RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
# batchv1 Job failure reasons the webhook accepts (validOnJobFailureReasons)
JOB_FAILURE_REASONS = [
    "BackoffLimitExceeded",
    "DeadlineExceeded",
    "FailedIndexes",
    "MaxFailedIndexesExceeded",
    "PodFailurePolicy",
]
POD_NAME_TOO_LONG = (
    "JobSet name is too long, pod names generated for this JobSet will exceed 63 characters"
)
JOB_NAME_TOO_LONG = (
    "JobSet name is too long, job names generated for this JobSet will exceed 63 characters"
)
SUBDOMAIN_TOO_LONG = ".spec.network.subdomain is too long, must be less than 63 characters"
GROUP_NAME_TOO_LONG = ".spec.replicatedJob[].groupName is too long, must be less than 63 characters"


def is_dns1035_label(value: str) -> list[str]:
    """k8s.io/apimachinery validation.IsDNS1035Label's messages."""
    problems = []
    if len(value) > 63:
        problems.append("must be no more than 63 characters")
    if not _DNS1035.match(value):
        problems.append(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start "
            "with an alphabetic character, and end with an alphanumeric character (e.g. "
            "'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
        )
    return problems


def is_dns1123_subdomain(value: str) -> list[str]:
    problems = []
    if len(value) > 253:
        problems.append("must be no more than 253 characters")
    if not _DNS1123_SUBDOMAIN.match(value):
        problems.append(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
            "'-' or '.', and must start and end with an alphanumeric character (e.g. "
            "'example.com', regex used for validation is "
            "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        )
    return problems


def _invalid(path: str, value: Any, message: str) -> str:
    return f'{path}: Invalid value: "{value}": {message}'


def _too_long(problem: str, replacement: str) -> str:
    """The webhook swaps IsDNS1035Label's length message for its own."""
    return replacement if "no more than 63" in problem else problem


def _internal(message: str) -> str:
    return f"<nil>: Internal error: {message}"


# -- JobSet: Default ------------------------------------------------------------------------
def default_jobset(js: dict[str, Any]) -> dict[str, Any]:
    """jobset_webhook.go Default: success policy All, startup AnyOrder, Indexed jobs, pod
    restartPolicy OnFailure, DNS hostnames on, rule names failurePolicyRule<N>."""
    js = copy.deepcopy(js)
    spec = js.setdefault("spec", {})
    spec.setdefault("successPolicy", {"operator": "All"})
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    for rjob in spec.get("replicatedJobs") or []:
        job = rjob.setdefault("template", {}).setdefault("spec", {})
        job.setdefault("completionMode", "Indexed")
        pod = job.setdefault("template", {}).setdefault("spec", {})
        pod.setdefault("restartPolicy", "OnFailure")
    network = spec.setdefault("network", {})
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    for index, rule in enumerate((spec.get("failurePolicy") or {}).get("rules") or []):
        if not rule.get("name"):
            rule["name"] = f"failurePolicyRule{index}"
    return js


# -- JobSet: ValidateCreate -----------------------------------------------------------------
def validate_subdomain(spec: dict[str, Any]) -> list[str]:
    """ValidateCreate: a set subdomain is a DNS-1123 subdomain and a DNS-1035 label."""
    subdomain = (spec.get("network") or {}).get("subdomain") or ""
    if not subdomain:
        return []
    path = "spec.network.subdomain"
    found = [_invalid(path, subdomain, m) for m in is_dns1123_subdomain(subdomain)]
    for problem in is_dns1035_label(subdomain):
        found.append(_invalid(path, subdomain, _too_long(problem, SUBDOMAIN_TOO_LONG)))
    return found


def validate_generated_names(name: str, index: int, rjob: dict[str, Any]) -> list[str]:
    """ValidateCreate: groupName, the longest child Job name (<js>-<rjob>-<replicas-1>) and,
    for an Indexed Job with completions, the longest pod name
    (<js>-<rjob>-<jobIdx>-<podIdx> plus a 5-character suffix) are DNS-1035 labels
    (placement.GenJobName, GenPodName)."""
    path = f"spec.replicatedJobs[{index}]"
    found = []
    group = rjob.get("groupName", "")
    for problem in is_dns1035_label(group):
        found.append(_invalid(f"{path}.groupName", group, _too_long(problem, GROUP_NAME_TOO_LONG)))
    replicas = rjob.get("replicas", 1)
    longest_job = f"{name}-{rjob['name']}-{replicas - 1}"
    for problem in is_dns1035_label(longest_job):
        found.append(_invalid(f"{path}.name", longest_job, _too_long(problem, JOB_NAME_TOO_LONG)))
    job = (rjob.get("template") or {}).get("spec") or {}
    if job.get("completionMode") == "Indexed" and job.get("completions") is not None:
        longest_pod = f"{name}-{rjob['name']}-{replicas - 1}-{job['completions'] - 1}-abcde"
        for problem in is_dns1035_label(longest_pod):
            # upstream reports the longest Job name as the value here
            message = _too_long(problem, POD_NAME_TOO_LONG)
            found.append(_invalid(f"{path}.name", longest_job, message))
    return found


def validate_failure_policy(spec: dict[str, Any], rjob_names: set[str]) -> list[str]:
    """validateFailurePolicy: RestartJob actions behind their (off) feature gate, rule names of
    1..128 characters matching RULE_NAME and unique, known targets and job failure reasons."""
    policy = spec.get("failurePolicy")
    if policy is None:
        return []
    rules = policy.get("rules") or []
    found: list[str] = []
    if any(r.get("action") in ("RestartJob", "RestartJobAndIgnoreMaxRestarts") for r in rules):
        return [
            _internal(
                "RestartJob and RestartJobAndIgnoreMaxRestarts failure policy actions are not "
                "allowed when RestartJob feature gate is disabled"
            )
        ]
    by_name: dict[str, list[int]] = {}
    for index, rule in enumerate(rules):
        name = rule.get("name", "")
        if not 1 <= len(name) <= 128:
            found.append(
                _internal(
                    f"invalid failure policy rule name of length {len(name)}, the rule name must "
                    "be at least 1 characters long and at most 128 characters long"
                )
            )
        by_name.setdefault(name, []).append(index)
        if not RULE_NAME.match(name):
            found.append(
                _internal(
                    f"invalid failure policy rule name '{name}', a failure policy rule name must "
                    "start with an alphabetic character, optionally followed by a string of "
                    "alphanumeric characters or '_,:', and must end with an alphanumeric "
                    "character or '_'"
                )
            )
        for target in rule.get("targetReplicatedJobs") or []:
            if target not in rjob_names:
                found.append(
                    _internal(
                        f"invalid replicatedJob name '{target}' in failure policy does not "
                        "appear in .spec.ReplicatedJobs"
                    )
                )
        for reason in rule.get("onJobFailureReasons") or []:
            if reason not in JOB_FAILURE_REASONS:
                found.append(
                    _internal(
                        f"invalid job failure reason '{reason}' in failure policy is not a "
                        "recognized job failure reason"
                    )
                )
    for name, indices in by_name.items():
        if len(indices) > 1:
            found.append(
                _internal(
                    f"rule names are not unique, rules with indices "
                    f"[{' '.join(map(str, indices))}] all have the same name '{name}'"
                )
            )
    return found


def validate_jobset_create(js: dict[str, Any]) -> list[str]:
    """jobset_webhook.go ValidateCreate (the parts tideflow's objects touch; coordinator and
    volume claim policies are not reproduced)."""
    spec, name = js.get("spec") or {}, js["metadata"].get("name", "")
    found: list[str] = []
    if (spec.get("failurePolicy") or {}).get("restartStrategy") == "InPlaceRestart":
        found.append(
            _internal(
                "InPlaceRestart restart strategy cannot be set when InPlaceRestart feature gate "
                "is disabled"
            )
        )
    rjobs = spec.get("replicatedJobs") or []
    if rjobs and rjobs[0].get("dependsOn"):
        found.append(_internal("DependsOn can't be set for the first ReplicatedJob"))
    found += validate_subdomain(spec)
    names: set[str] = set()
    for index, rjob in enumerate(rjobs):
        names.add(rjob["name"])
        found += validate_generated_names(name, index, rjob)
        for dependency in rjob.get("dependsOn") or []:
            if dependency.get("name") not in names:
                found.append(
                    _internal(
                        f"replicatedJob: {rjob['name']} cannot depend on replicatedJob: "
                        f"{dependency.get('name')}"
                    )
                )
    for target in (spec.get("successPolicy") or {}).get("targetReplicatedJobs") or []:
        if target not in names:
            found.append(
                _internal(
                    f"invalid replicatedJob name '{target}' does not appear in .spec.ReplicatedJobs"
                )
            )
    return found + validate_failure_policy(spec, names)


def validate_jobset_update(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """jobset_webhook.go ValidateUpdate: replicatedJobs and managedBy are immutable, except the
    pod template's labels, annotations, nodeSelector, tolerations and schedulingGates while
    the JobSet is (or is being) suspended, which Kueue changes when it admits it."""
    munged = copy.deepcopy((new.get("spec") or {}).get("replicatedJobs") or [])
    previous = (old.get("spec") or {}).get("replicatedJobs") or []
    suspended = (old.get("spec") or {}).get("suspend") or (new.get("spec") or {}).get("suspend")
    if suspended:
        by_name = {r["name"]: r for r in previous}
        for rjob in munged:
            before = by_name.get(rjob["name"])
            if before is None:
                continue
            template = rjob["template"]["spec"]["template"]
            old_template = before["template"]["spec"]["template"]
            metadata = template.setdefault("metadata", {})
            for key in ("labels", "annotations"):
                _copy_field(metadata, old_template.get("metadata") or {}, key)
            if not metadata and "metadata" not in old_template:
                template.pop("metadata")
            for key in ("nodeSelector", "tolerations", "schedulingGates"):
                _copy_field(template["spec"], old_template["spec"], key)
    found = []
    if munged != previous:
        found.append('spec.replicatedJobs: Invalid value: "array": field is immutable')
    if (new.get("spec") or {}).get("managedBy") != (old.get("spec") or {}).get("managedBy"):
        found.append('spec.managedBy: Invalid value: "string": field is immutable')
    return found


def _copy_field(target: dict[str, Any], source: dict[str, Any], key: str) -> None:
    if key in source:
        target[key] = copy.deepcopy(source[key])
    else:
        target.pop(key, None)


def jobset_refusal(name: str, causes: list[str]) -> ApiError:
    joined = causes[0] if len(causes) == 1 else "[" + ", ".join(causes) + "]"
    return webhook_denied(
        JOBSET_VALIDATE,
        422,
        f'JobSet.jobset.x-k8s.io "{name}" is invalid: {joined}',
        reason="Invalid",
    )


# -- Kueue's JobSet webhook ------------------------------------------------------------------
def kueue_default(js: dict[str, Any], default_queue_exists: bool) -> dict[str, Any]:
    """Kueue JobSetWebhook.Default: the namespace's "default" LocalQueue when none is named
    (ApplyDefaultLocalQueue), then suspend a JobSet that names a queue until Kueue admits it
    (ApplyDefaultForSuspend; manageJobsWithoutQueueName is off by default)."""
    js = copy.deepcopy(js)
    labels = js.setdefault("metadata", {}).setdefault("labels", {})
    if not labels.get(QUEUE_LABEL) and default_queue_exists:
        labels[QUEUE_LABEL] = "default"
    if labels.get(QUEUE_LABEL) and not (js.get("spec") or {}).get("suspend"):
        js.setdefault("spec", {})["suspend"] = True
    return js


def kueue_validate_create(js: dict[str, Any]) -> list[str]:
    """Kueue JobSetWebhook.validateCreate -> jobframework ValidateJobOnCreate (validation.go,
    not in the reference; from memory): the queue-name label is a DNS-1123 subdomain."""
    queue = ((js.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL, "")
    if not queue:
        return []
    return [
        _invalid(f"metadata.labels[{QUEUE_LABEL}]", queue, message)
        for message in is_dns1123_subdomain(queue)
    ]


def kueue_refusal(causes: list[str]) -> ApiError:
    joined = causes[0] if len(causes) == 1 else "[" + ", ".join(causes) + "]"
    return webhook_denied(JOBSET_VALIDATE, 403, joined, reason="Forbidden")
