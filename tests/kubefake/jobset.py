"""The JobSet controller, driven by the test.

JobSet (kubernetes-sigs/jobset @ 08dfbdf; api/jobset/v1alpha2/jobset_types.go,
site/content/en/docs/tasks/failure_policy.md, docs/concepts):

* child Jobs ``<jobset>-<replicatedJob>-<index>`` (placement.GenJobName), labelled
  with the JobSet's keys (jobset-name, replicatedjob-name, job-index, ...), their
  pods given the network's subdomain, and a headless Service of that name when
  ``network.enableDNSHostnames`` is on; created suspended while the JobSet is;
* a failed child Job is answered by the first failure-policy rule that matches it
  (its onJobFailureReasons, onJobFailureMessagePatterns and targetReplicatedJobs;
  an empty list matches all); no rule matching means RestartJobSet; no failure
  policy at all fails the JobSet. FailJobSet fails it; RestartJobSet recreates
  every Job when ``restartsCountTowardsMax < maxRestarts`` (``restarts`` and
  ``restartsCountTowardsMax`` += 1), else fails it (ReachedMaxRestarts);
  RestartJobSetAndIgnoreMaxRestarts recreates without counting towards the max;
* Completed when the success policy holds (All: every targeted Job completed).
  Condition reasons and messages are written from memory of jobset
  pkg/constants (not in the reference).

The Job controller under it is batch_jobs.py.
"""

from __future__ import annotations

import copy
import re
from typing import TYPE_CHECKING, Any

from tests.kubefake.batch_jobs import condition, controller_owner, is_true
from tests.kubefake.resources import BY_KIND

if TYPE_CHECKING:
    from tests.kubefake.fake import KubeFake

JOBSET = BY_KIND[("jobset.x-k8s.io/v1alpha2", "JobSet")]
JOB = BY_KIND[("batch/v1", "Job")]
POD = BY_KIND[("v1", "Pod")]
NAME_KEY, RJOB_KEY = "jobset.sigs.k8s.io/jobset-name", "jobset.sigs.k8s.io/replicatedjob-name"
INDEX_KEY = "batch.kubernetes.io/job-completion-index"


class JobSets:
    def __init__(self, fake: KubeFake) -> None:
        self.fake = fake

    def jobset(self, namespace: str, name: str) -> dict[str, Any]:
        found = self.fake.store.get(JOBSET, namespace, name)
        if found is None:
            raise KeyError(f"no JobSet {namespace}/{name}")
        return found

    def jobs(self, js: dict[str, Any]) -> list[dict[str, Any]]:
        meta = js["metadata"]
        return self.fake.store.list(JOB, meta["namespace"], f"{NAME_KEY}={meta['name']}")[0]

    # -- creating ----------------------------------------------------------------------------
    def added(self, js: dict[str, Any]) -> None:
        network = js["spec"].get("network") or {}
        if network.get("enableDNSHostnames"):
            self.fake.internal_create(
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {
                        "name": network.get("subdomain") or js["metadata"]["name"],
                        "namespace": js["metadata"]["namespace"],
                        "ownerReferences": controller_owner(js),
                    },
                    "spec": {
                        "clusterIP": "None",
                        "selector": {NAME_KEY: js["metadata"]["name"]},
                        "publishNotReadyAddresses": bool(network.get("publishNotReadyAddresses")),
                    },
                }
            )
        suspended = bool(js["spec"].get("suspend"))
        conditions = (
            [condition("Suspended", True, "SuspendedJobs", "jobset is suspended")]
            if suspended
            else []
        )
        js = self.fake.write_status(JOBSET, js, {"restarts": 0, "conditions": conditions})
        self._create_jobs(js)
        self._write(js)

    def _create_jobs(self, js: dict[str, Any]) -> None:
        meta, spec = js["metadata"], js["spec"]
        restarts = (js.get("status") or {}).get("restarts", 0)
        subdomain = (spec.get("network") or {}).get("subdomain") or meta["name"]
        for rjob in spec["replicatedJobs"]:
            for index in range(rjob.get("replicas", 1)):
                labels = {
                    NAME_KEY: meta["name"],
                    RJOB_KEY: rjob["name"],
                    "jobset.sigs.k8s.io/job-index": str(index),
                    "jobset.sigs.k8s.io/replicatedjob-replicas": str(rjob.get("replicas", 1)),
                    "jobset.sigs.k8s.io/restart-attempt": str(restarts),
                }
                job_spec = copy.deepcopy(rjob["template"]["spec"])
                job_spec["suspend"] = bool(spec.get("suspend"))
                template = job_spec["template"]
                template.setdefault("metadata", {}).setdefault("labels", {}).update(labels)
                if (spec.get("network") or {}).get("enableDNSHostnames"):
                    template["spec"]["subdomain"] = subdomain
                job = self.fake.internal_create(
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "metadata": {
                            "name": f"{meta['name']}-{rjob['name']}-{index}",
                            "namespace": meta["namespace"],
                            "labels": labels,
                            "ownerReferences": controller_owner(js),
                        },
                        "spec": job_spec,
                    }
                )
                job = self.fake.write_status(JOB, job, {"active": 0, "failed": 0, "succeeded": 0})
                if not job_spec["suspend"]:
                    self.fake.jobs.create_pods(job)

    # -- reacting ----------------------------------------------------------------------------
    def updated(self, new: dict[str, Any], old: dict[str, Any]) -> None:
        """Resumed (Kueue admitted it): the child Jobs take the new pod template's placement,
        are resumed and make their pods."""
        if not (old["spec"].get("suspend") and not new["spec"].get("suspend")):
            return
        templates = {
            r["name"]: r["template"]["spec"]["template"] for r in new["spec"]["replicatedJobs"]
        }
        for job in self.jobs(new):
            source = templates[job["metadata"]["labels"][RJOB_KEY]]
            pod_spec = job["spec"]["template"]["spec"]
            for key in ("nodeSelector", "tolerations"):
                if key in source["spec"]:
                    pod_spec[key] = copy.deepcopy(source["spec"][key])
            job["spec"]["suspend"] = False
            self.fake.jobs.create_pods(self.fake.store.update(JOB, job))
        conditions = [
            c for c in (new.get("status") or {}).get("conditions") or [] if c["type"] != "Suspended"
        ]
        conditions.append(condition("Suspended", False, "ResumeJobs", "jobset is resumed"))
        self._write(
            self.jobset(new["metadata"]["namespace"], new["metadata"]["name"]),
            conditions=conditions,
        )

    def job_settled(self, job: dict[str, Any]) -> None:
        owner = job["metadata"]["labels"][NAME_KEY]
        js = self.fake.store.get(JOBSET, job["metadata"]["namespace"], owner)
        if js is None or is_true(js, "Completed") or is_true(js, "Failed"):
            return
        job = self.fake.store.get(JOB, job["metadata"]["namespace"], job["metadata"]["name"])
        if job is not None and is_true(job, "Failed"):
            failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
            return self.failure_policy(js, job, failed["reason"], failed["message"])
        self._write(js)
        policy = js["spec"].get("successPolicy") or {"operator": "All"}
        targets = set(
            policy.get("targetReplicatedJobs") or [r["name"] for r in js["spec"]["replicatedJobs"]]
        )
        jobs = [j for j in self.jobs(js) if j["metadata"]["labels"][RJOB_KEY] in targets]
        done = [j for j in jobs if is_true(j, "Complete")]
        if done and (len(done) == len(jobs) or policy["operator"] == "Any"):
            self._finish(js, "Completed", "AllJobsCompleted", "jobset completed successfully")
        return None

    def failure_policy(
        self, js: dict[str, Any], job: dict[str, Any], reason: str, message: str
    ) -> None:
        """The JobSet controller's answer to a failed child Job (failure_policy.md)."""
        policy = js["spec"].get("failurePolicy")
        name = job["metadata"]["name"]
        if policy is None:
            return self._finish(
                js,
                "Failed",
                "FailedJobs",
                f"jobset failed due to one or more job failures (first failed job: {name})",
            )
        rjob = job["metadata"]["labels"][RJOB_KEY]
        action = "RestartJobSet"
        for rule in policy.get("rules") or []:
            reasons = rule.get("onJobFailureReasons") or []
            patterns = rule.get("onJobFailureMessagePatterns") or []
            targets = rule.get("targetReplicatedJobs") or []
            if (
                (not reasons or reason in reasons)
                and (not patterns or any(re.search(p, message) for p in patterns))
                and (not targets or rjob in targets)
            ):
                action = rule["action"]
                break
        status = js["status"]
        if action == "FailJobSet":
            return self._finish(
                js,
                "Failed",
                "FailJobSetFailurePolicyRuleAction",
                f"FailJobSet failure policy rule action (first failed job: {name})",
            )
        counted = action == "RestartJobSet"
        if counted and status.get("restartsCountTowardsMax", 0) >= policy.get("maxRestarts", 0):
            return self._finish(
                js,
                "Failed",
                "ReachedMaxRestarts",
                "jobset failed due to reaching max number of restarts",
            )
        for child in self.jobs(js):
            self.fake.api.delete(JOB, child)
        js = self._write(
            js,
            restarts=status.get("restarts", 0) + 1,
            restartsCountTowardsMax=status.get("restartsCountTowardsMax", 0) + counted,
        )
        self._create_jobs(js)
        self._write(js)
        return None

    def _finish(self, js: dict[str, Any], kind: str, reason: str, message: str) -> None:
        conditions = [c for c in js["status"].get("conditions") or [] if c["type"] != kind]
        conditions.append(condition(kind, True, reason, message))
        self._write(js, conditions=conditions, terminalState=kind)
        self.fake.kueue.release(js)

    def _write(self, js: dict[str, Any], **changes: Any) -> dict[str, Any]:
        js = self.jobset(js["metadata"]["namespace"], js["metadata"]["name"])
        by_rjob: dict[str, dict[str, Any]] = {
            r["name"]: {
                "name": r["name"],
                "ready": 0,
                "succeeded": 0,
                "failed": 0,
                "active": 0,
                "suspended": 0,
            }
            for r in js["spec"]["replicatedJobs"]
        }
        for job in self.jobs(js):
            counts, status = by_rjob[job["metadata"]["labels"][RJOB_KEY]], job.get("status") or {}
            parallelism = job["spec"].get("parallelism") or 1
            counts["succeeded"] += is_true(job, "Complete")
            counts["failed"] += is_true(job, "Failed")
            counts["suspended"] += bool(job["spec"].get("suspend"))
            counts["active"] += status.get("active", 0) > 0
            counts["ready"] += status.get("ready", 0) + status.get("succeeded", 0) >= parallelism
        status = {**js["status"], "replicatedJobsStatus": list(by_rjob.values()), **changes}
        return self.fake.write_status(JOBSET, js, status)

    # -- what a test drives -------------------------------------------------------------------
    def pods_running(self, namespace: str, name: str, *, node: str = "node-0") -> dict[str, Any]:
        with self.fake.lock:
            for job in self.jobs(self.jobset(namespace, name)):
                for pod in self.fake.jobs.active(job):
                    if (pod.get("status") or {}).get("phase", "Pending") == "Pending":
                        self.fake.pods.run(namespace, pod["metadata"]["name"], node=node)
            return self.jobset(namespace, name)

    def pod(
        self, namespace: str, name: str, *, rjob: str = "worker", job_index: int = 0, index: int = 0
    ) -> dict[str, Any]:
        job = self.fake.store.get(JOB, namespace, f"{name}-{rjob}-{job_index}")
        return next(
            p
            for p in self.fake.jobs.active(job)
            if p["metadata"]["labels"][INDEX_KEY] == str(index)
        )

    def pod_failed(
        self,
        namespace: str,
        name: str,
        *,
        rjob: str = "worker",
        job_index: int = 0,
        index: int = 0,
        exit_code: int = 1,
    ) -> dict[str, Any]:
        with self.fake.lock:
            pod = self.pod(namespace, name, rjob=rjob, job_index=job_index, index=index)
            self.fake.pods.fail(namespace, pod["metadata"]["name"], exit_code)
            return self.jobset(namespace, name)

    def job_failed(
        self,
        namespace: str,
        name: str,
        *,
        rjob: str = "worker",
        job_index: int = 0,
        reason: str = "BackoffLimitExceeded",
        message: str = "",
    ) -> dict[str, Any]:
        with self.fake.lock:
            job = self.fake.store.get(JOB, namespace, f"{name}-{rjob}-{job_index}")
            self.fake.jobs.fail(job, reason, message)
            return self.jobset(namespace, name)

    def pods_succeeded(self, namespace: str, name: str) -> dict[str, Any]:
        with self.fake.lock:
            for job in self.jobs(self.jobset(namespace, name)):
                for pod in self.fake.jobs.active(job):
                    if (pod.get("status") or {}).get("phase") == "Running":
                        self.fake.pods.succeed(namespace, pod["metadata"]["name"])
            return self.jobset(namespace, name)
