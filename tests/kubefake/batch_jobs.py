"""The Job controller (batch/v1), as far as a JobSet's child Jobs need it.

Reimplemented from the Kubernetes documentation ("Jobs": Indexed completion mode;
"Handling retriable and non-retriable pod failures with Pod failure policy"),
upstream k8s.io/kubernetes pkg/controller/job (not in the reference):

* an Indexed Job runs one pod per completion index, named ``<job>-<index>-<suffix>``
  with host name ``<job>-<index>``, the index in the
  ``batch.kubernetes.io/job-completion-index`` label and annotation and in
  ``JOB_COMPLETION_INDEX``;
* a failed pod is matched against ``podFailurePolicy.rules`` in order: onExitCodes
  (In / NotIn, for the named container or any; NotIn never matches exit 0) or
  onPodConditions (type and status); FailJob fails the Job with reason
  PodFailurePolicy and a message naming the rule's index, Ignore does not count
  the failure, Count or no match counts it; more counted failures than
  ``backoffLimit`` fail the Job with BackoffLimitExceeded; otherwise the index
  gets a new pod;
* the Job completes when every index has succeeded; a failed Job's remaining
  pods are removed.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from tests.kubefake.pods import terminating
from tests.kubefake.resources import BY_KIND
from tests.kubefake.store import now

if TYPE_CHECKING:
    from tests.kubefake.fake import KubeFake

JOB = BY_KIND[("batch/v1", "Job")]
POD = BY_KIND[("v1", "Pod")]
INDEX_KEY = "batch.kubernetes.io/job-completion-index"


def condition(kind: str, status: bool, reason: str, message: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now(),
    }


def is_true(obj: dict[str, Any], kind: str) -> bool:
    return any(
        c["type"] == kind and c["status"] == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def controller_owner(obj: dict[str, Any]) -> list[dict[str, Any]]:
    meta = obj["metadata"]
    return [
        {
            "apiVersion": obj["apiVersion"],
            "kind": obj["kind"],
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


class Jobs:
    def __init__(self, fake: KubeFake) -> None:
        self.fake = fake

    def pods(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        """The Job's pods (by its controller-uid: a recreated Job of the same name has others)."""
        meta = job["metadata"]
        selector = f"batch.kubernetes.io/controller-uid={meta['uid']}"
        return self.fake.store.list(POD, meta["namespace"], selector)[0]

    def active(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pods(job)
            if (p.get("status") or {}).get("phase", "Pending") in ("Pending", "Running")
            and not terminating(p)
        ]

    def create_pods(self, job: dict[str, Any]) -> None:
        """The Job controller: one pod per completion index without an active or done pod."""
        spec, meta = job["spec"], job["metadata"]
        taken = {
            p["metadata"]["labels"][INDEX_KEY]
            for p in self.pods(job)
            if (p.get("status") or {}).get("phase") != "Failed" and not terminating(p)
        }
        for index in range(spec.get("completions") or spec.get("parallelism") or 1):
            if str(index) in taken:
                continue
            template = copy.deepcopy(spec["template"])
            pod_spec = template["spec"]
            pod_spec["hostname"] = f"{meta['name']}-{index}"
            for container in pod_spec.get("containers", []):
                container.setdefault("env", []).append(
                    {
                        "name": "JOB_COMPLETION_INDEX",
                        "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{INDEX_KEY}']"}},
                    }
                )
            labels = {
                **((template.get("metadata") or {}).get("labels") or {}),
                "batch.kubernetes.io/controller-uid": meta["uid"],
                "batch.kubernetes.io/job-name": meta["name"],
                INDEX_KEY: str(index),
            }
            pod = self.fake.internal_create(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "generateName": f"{meta['name']}-{index}-",
                        "namespace": meta["namespace"],
                        "labels": labels,
                        # The template's annotations, then the index (pkg/controller/
                        # controller_utils.go GetPodFromTemplate; job/indexed_job_utils.go
                        # addCompletionIndexAnnotation).
                        "annotations": {
                            **((template.get("metadata") or {}).get("annotations") or {}),
                            INDEX_KEY: str(index),
                        },
                        "ownerReferences": controller_owner(job),
                    },
                    "spec": pod_spec,
                }
            )
            self.fake.write_status(POD, pod, {"phase": "Pending"})
        job = self.fake.store.get(JOB, meta["namespace"], meta["name"])
        if job is not None:
            status = {**(job.get("status") or {}), "active": len(self.active(job))}
            self.fake.write_status(JOB, job, status)

    @staticmethod
    def pod_failure_rule(job: dict[str, Any], pod: dict[str, Any]) -> tuple[str, str] | None:
        """The action and message of the first podFailurePolicy rule matching a failed pod."""
        meta, status = pod["metadata"], pod.get("status") or {}
        where = f"{meta['namespace']}/{meta['name']}"
        rules = (job["spec"].get("podFailurePolicy") or {}).get("rules") or []
        for index, rule in enumerate(rules):
            codes = rule.get("onExitCodes")
            if codes:
                for container in status.get("containerStatuses") or []:
                    if codes.get("containerName") not in (None, container["name"]):
                        continue
                    code = ((container.get("state") or {}).get("terminated") or {}).get("exitCode")
                    if code is None:
                        continue
                    inside = code in codes["values"]
                    if inside if codes["operator"] == "In" else (not inside and code != 0):
                        return rule["action"], (
                            f"Container {container['name']} for pod {where} failed with exit "
                            f"code {code} matching {rule['action']} rule at index {index}"
                        )
            for pattern in rule.get("onPodConditions") or []:
                for condition in status.get("conditions") or []:
                    wanted = pattern.get("status", "True")
                    if condition["type"] == pattern["type"] and condition["status"] == wanted:
                        return rule["action"], (
                            f"Pod {where} has condition {pattern['type']} matching "
                            f"{rule['action']} rule at index {index}"
                        )
        return None

    def pod_changed(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        job = self.fake.store.get(
            JOB, meta["namespace"], meta["labels"]["batch.kubernetes.io/job-name"]
        )
        owners = {o.get("uid") for o in meta.get("ownerReferences") or []}
        if job is None or job["metadata"]["uid"] not in owners:
            return
        if is_true(job, "Failed") or is_true(job, "Complete"):
            return
        phase = (pod.get("status") or {}).get("phase")
        status = dict(job.get("status") or {})
        if phase == "Failed":
            matched = self.pod_failure_rule(job, pod)
            action, message = matched or ("Count", "")
            if action == "FailJob":
                return self.fail(job, "PodFailurePolicy", message)
            if action != "Ignore":
                status["failed"] = status.get("failed", 0) + 1
                if status["failed"] > job["spec"].get("backoffLimit", 6):
                    self.fake.write_status(JOB, job, status)
                    return self.fail(
                        self.fake.store.get(JOB, meta["namespace"], job["metadata"]["name"]),
                        "BackoffLimitExceeded",
                        "Job has reached the specified backoff limit",
                    )
            job = self.fake.write_status(JOB, job, status)
            self.create_pods(job)
        active = self.active(job)
        status["active"] = len(active)
        status["ready"] = sum((p.get("status") or {}).get("phase") == "Running" for p in active)
        succeeded = [
            p for p in self.pods(job) if (p.get("status") or {}).get("phase") == "Succeeded"
        ]
        status["succeeded"] = len(succeeded)
        if status["succeeded"] >= (job["spec"].get("completions") or 1):
            status["conditions"] = [condition("Complete", True, "CompletionsReached", "")]
            status["active"] = 0
        self.fake.write_status(JOB, job, status)
        self.fake.jobset.job_settled(job)

    def fail(self, job: dict[str, Any], reason: str, message: str) -> None:
        """The Job fails: its other pods are removed, then its owner reacts."""
        status = dict(job.get("status") or {})
        status["conditions"] = [condition("Failed", True, reason, message)]
        status["active"] = 0
        self.fake.write_status(JOB, job, status)
        for pod in self.active(job):
            self.fake.api.delete(POD, pod)
        self.fake.jobset.job_settled(job)
