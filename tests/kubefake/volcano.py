"""Volcano's queue and job controllers, driven by the test (volcano @ ed72c7c).

* Queue: a new queue is opened (``status.state: Open``), as the queue controller
  does (docs/design/queue/queue.md).
* Job: pods are made as createJobPod makes them (job_controller_util.go: name
  ``<job>-<task>-<index>``, volcano labels and annotations, the job's
  schedulerName and priorityClassName), with the env plugin's ``VK_TASK_INDEX`` /
  ``VC_TASK_INDEX`` (plugins/env/env.go OnPodCreate) and the svc plugin's host
  name, subdomain, hosts ConfigMap, headless Service and NetworkPolicy
  (plugins/svc/svc.go OnPodCreate, OnJobAdd, GenerateHosts).
* A pod's change becomes a request as job_controller_handler.go makes it
  (updatePod: PodFailed with the first container's exit code, TaskCompleted when
  every pod of the task succeeded; deletePod: PodEvicted), and the request an
  action as applyPolicies decides (job_controller_util.go: the task's policies
  first, then the job's, in order, the first match wins; within one policy its
  events are checked before its exit code; no match syncs the job).
* The action runs in the job's state as state/*.go do: pending.go and running.go
  (RestartJob kills every pod, ``retryCount += 1``, Restarting; AbortJob,
  TerminateJob, CompleteJob kill the running pods and go to Aborting,
  Terminating, Completing), restarting.go (Failed once ``retryCount >=
  maxRetry``, else Pending when the pods are gone; so maxRetry N allows N-1
  restarts, as test/e2e/jobp/job_restart.go shows: maxRetry 2 ends Failed with
  retryCount 2), completing/terminating/aborting.go (Completed, Terminated,
  Aborted once no pod runs), and running.go's sync (Completed or Failed when
  every pod has finished, by minAvailable).

Requests are handled one at a time, in order (the controller's work queue). A
killed pod is deleted gracefully and stays Terminating until the test finishes
its termination (``fake.pods.finish_terminating``), so Restarting, Completing and
the like last until then. KillJob raises ``status.version`` (from memory of
job_controller_actions.go, not in the reference), and a request from a pod of an
older version only syncs the job (applyPolicies' outdated-request rule), so the
controller's own kills never count as failures. No PodGroup is made and no
scheduler decides anything: the test starts and ends pods through these methods.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from tests.kubefake.pods import terminating
from tests.kubefake.resources import BY_KIND
from tests.kubefake.store import now
from tests.kubefake.volcano_pods import JOB_NAME, TASK_SPEC, make_pod, svc_objects

VERSION = "volcano.sh/job-version"

if TYPE_CHECKING:
    from tests.kubefake.fake import KubeFake

JOB = BY_KIND[("batch.volcano.sh/v1alpha1", "Job")]
QUEUE = BY_KIND[("scheduling.volcano.sh/v1beta1", "Queue")]
POD = BY_KIND[("v1", "Pod")]
INTERNAL_EVENTS = {"OutOfSync", "CommandIssued", "PodRunning"}
TERMINAL = {"Completed", "Failed", "Terminated", "Aborted"}


class Volcano:
    def __init__(self, fake: KubeFake) -> None:
        self.fake = fake
        self.restarts: dict[tuple[str, str], int] = {}  # (ns, job) -> times its pods came back
        self._queue: deque[tuple[str, str, str]] = deque()
        self._busy = False

    # -- queue controller ------------------------------------------------------------------
    def queue_added(self, queue: dict[str, Any]) -> None:
        status = {"state": "Open", **(queue.get("status") or {})}
        self.fake.write_status(QUEUE, queue, status)

    # -- reading -----------------------------------------------------------------------------
    def job(self, namespace: str, name: str) -> dict[str, Any]:
        found = self.fake.store.get(JOB, namespace, name)
        if found is None:
            raise KeyError(f"no Volcano Job {namespace}/{name}")
        return found

    def phase(self, namespace: str, name: str) -> str:
        return str(self.job(namespace, name)["status"]["state"]["phase"])

    def pods(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        meta = job["metadata"]
        found, _ = self.fake.store.list(POD, meta["namespace"], f"{JOB_NAME}={meta['name']}")
        return [
            p
            for p in found
            if any(o.get("uid") == meta["uid"] for o in p["metadata"].get("ownerReferences", []))
        ]

    def pod(self, namespace: str, name: str, task: str = "worker", index: int = 0) -> dict:
        return self.fake.pods.get(namespace, f"{name}-{task}-{index}")

    # -- acting on pods ----------------------------------------------------------------------
    def _create_missing_pods(self, job: dict[str, Any]) -> None:
        existing = {p["metadata"]["name"] for p in self.pods(job)}
        for task in job["spec"]["tasks"]:
            for index in range(task["replicas"]):
                pod = make_pod(job, task, index)
                if pod["metadata"]["name"] not in existing:
                    created = self.fake.internal_create(pod)
                    self.fake.write_status(POD, created, {"phase": "Pending"})

    def _kill(self, job: dict[str, Any], *, soft: bool) -> None:
        """KillJob: delete the job's pods (soft: keep those that succeeded or failed)."""
        for pod in self.pods(job):
            if terminating(pod):
                continue
            if soft and (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            self.fake.api.delete(POD, pod)

    def _write(self, job: dict[str, Any], phase: str | None = None, **changes: Any) -> dict:
        job = self.job(job["metadata"]["namespace"], job["metadata"]["name"])
        status = dict(job.get("status") or {})
        counts = {"pending": 0, "running": 0, "succeeded": 0, "failed": 0, "unknown": 0}
        counts["terminating"] = 0
        tasks: dict[str, dict[str, dict[str, int]]] = {}
        for pod in self.pods(job):
            if terminating(pod):
                counts["terminating"] += 1
                continue
            pod_phase = (pod.get("status") or {}).get("phase", "Pending")
            counts[pod_phase.lower()] = counts.get(pod_phase.lower(), 0) + 1
            task = pod["metadata"]["annotations"][TASK_SPEC]
            by_phase = tasks.setdefault(task, {"phase": {}})["phase"]
            by_phase[pod_phase] = by_phase.get(pod_phase, 0) + 1
        status.update(counts, taskStatusCount=tasks, **changes)
        if phase is not None and phase != status["state"].get("phase"):
            if (status["state"].get("phase"), phase) == ("Restarting", "Pending"):
                key = (job["metadata"]["namespace"], job["metadata"]["name"])
                self.restarts[key] = self.restarts.get(key, 0) + 1
            status["state"] = {"phase": phase, "lastTransitionTime": now()}
        return self.fake.write_status(JOB, job, status)

    # -- the job's life ----------------------------------------------------------------------
    def job_added(self, job: dict[str, Any]) -> None:
        plugins = job["spec"].get("plugins") or {}
        if "svc" in plugins:
            for obj in svc_objects(job):
                self.fake.internal_create(obj)
        job = self.fake.write_status(
            JOB,
            job,
            {
                "state": {"phase": "Pending", "lastTransitionTime": now()},
                "minAvailable": job["spec"]["minAvailable"],
                "retryCount": 0,
                "version": 0,
                "controlledResources": {f"plugin-{p}": p for p in plugins},
            },
        )
        self._create_missing_pods(job)
        self._write(job)

    @staticmethod
    def apply_policies(job: dict[str, Any], task: str, event: str, exit_code: int = 0) -> str:
        """job_controller_util.go applyPolicies: the action for a pod event."""
        if event in INTERNAL_EVENTS:
            return "SyncJob"
        task_policies = next(
            (t.get("policies") or [] for t in job["spec"]["tasks"] if t["name"] == task), []
        )
        for policies in (task_policies, job["spec"].get("policies") or []):
            for policy in policies:
                events = (policy.get("events") or []) + (
                    [policy["event"]] if policy.get("event") else []
                )
                listed = bool(events and event and (event in events or "*" in events))
                # shouldConfigureTimeout: PodPending matches only with a timeout
                if listed and (event != "PodPending" or policy.get("timeout") is not None):
                    return str(policy["action"])
                if policy.get("exitCode") is not None and policy["exitCode"] == exit_code:
                    return str(policy["action"])
        return "SyncJob"

    def _execute(self, job: dict[str, Any], action: str) -> dict[str, Any]:
        """One state.Execute of the job's current state (state/*.go)."""
        status = job["status"]
        phase = status["state"]["phase"]
        retries = int(status.get("retryCount", 0))
        version = int(status.get("version", 0))
        if phase in ("Pending", "Running"):
            if action in ("RestartJob", "RestartTask", "RestartPod", "RestartPartition"):
                self._write(job, "Restarting", retryCount=retries + 1, version=version + 1)
                self._kill(job, soft=False)
                return self._write(job)
            if action in ("AbortJob", "TerminateJob", "CompleteJob"):
                following = {"AbortJob": "Aborting", "TerminateJob": "Terminating"}
                self._write(job, following.get(action, "Completing"), version=version + 1)
                self._kill(job, soft=True)
                return self._write(job)
            return self._sync(job, phase)
        if phase == "Restarting":  # restarting.go restartingUpdateStatus
            self._kill(job, soft=False)
            job = self._write(job)
            if retries >= int(job["spec"].get("maxRetry", 3)):
                return self._write(job, "Failed")
            total = sum(t["replicas"] for t in job["spec"]["tasks"])
            if total - job["status"]["terminating"] >= job["status"]["minAvailable"]:
                return self._write(job, "Pending")
            return job
        if phase in ("Aborting", "Terminating", "Completing"):
            if action == "ResumeJob" and phase == "Aborting":
                return self._write(job, "Restarting", retryCount=retries + 1)
            self._kill(job, soft=True)
            job = self._write(job)
            if any(job["status"][k] for k in ("terminating", "pending", "running")):
                return job
            done = {"Aborting": "Aborted", "Terminating": "Terminated", "Completing": "Completed"}
            return self._write(job, done[phase])
        return job

    def _sync(self, job: dict[str, Any], phase: str) -> dict[str, Any]:
        """The SyncJob branch of pending.go and running.go."""
        if phase == "Pending":
            self._create_missing_pods(job)
        job = self._write(job)
        status, spec = job["status"], job["spec"]
        total = sum(t["replicas"] for t in spec["tasks"])
        done = status["succeeded"] + status["failed"]
        if phase == "Pending":
            if spec["minAvailable"] <= status["running"] + done:
                return self._write(job, "Running")
            return job
        if done == total:
            min_success = spec.get("minSuccess")
            task_minimum = sum(t.get("minAvailable", t["replicas"]) for t in spec["tasks"])
            if spec["minAvailable"] >= task_minimum:
                for task in spec["tasks"]:
                    succeeded = status["taskStatusCount"].get(task["name"], {}).get("phase", {})
                    if succeeded.get("Succeeded", 0) < task.get("minAvailable", 0):
                        return self._write(job, "Failed")
            if min_success is not None and status["succeeded"] < min_success:
                return self._write(job, "Failed")
            return self._write(
                job, "Completed" if status["succeeded"] >= spec["minAvailable"] else "Failed"
            )
        if status["pending"] > total - spec["minAvailable"]:
            return self._write(job, "Pending")
        return job

    def _handle_one(self, namespace: str, name: str, action: str) -> None:
        """Run ``action``, then sync until the job's phase settles (the controller's requeues)."""
        job = self.fake.store.get(JOB, namespace, name)
        if job is None or job["status"]["state"]["phase"] in TERMINAL:
            return
        job = self._execute(job, action)
        for _ in range(6):
            before = job["status"]["state"]["phase"]
            if before in TERMINAL:
                return
            job = self._execute(job, "SyncJob")
            if job["status"]["state"]["phase"] == before:
                return

    def handle(self, namespace: str, name: str, action: str) -> None:
        """Queue a request (an action, or SyncJob) and work the queue through, in order."""
        with self.fake.lock:
            self._queue.append((namespace, name, action))
            if self._busy:
                return
            self._busy = True
            try:
                while self._queue:
                    self._handle_one(*self._queue.popleft())
            finally:
                self._busy = False

    def _request(self, pod: dict[str, Any], event: str, exit_code: int = 0) -> None:
        """A pod's event as a request: applyPolicies decides unless the request is for another
        job of that name or from an older version of the job (then the job is only synced)."""
        meta = pod["metadata"]
        job = self.fake.store.get(JOB, meta["namespace"], meta["annotations"][JOB_NAME])
        if job is None:
            return
        owners = {o.get("uid") for o in meta.get("ownerReferences") or []}
        version = int(meta["annotations"].get(VERSION, "0"))
        action = "SyncJob"
        if job["metadata"]["uid"] in owners and version >= int(job["status"].get("version", 0)):
            action = self.apply_policies(job, meta["annotations"][TASK_SPEC], event, exit_code)
        self.handle(meta["namespace"], job["metadata"]["name"], action)

    def pod_changed(self, pod: dict[str, Any]) -> None:
        """job_controller_handler.go updatePod: the event a pod's new phase raises."""
        status = pod.get("status") or {}
        phase = status.get("phase")
        if phase == "Failed":
            terminated = ((status.get("containerStatuses") or [{}])[0].get("state") or {}).get(
                "terminated"
            ) or {}
            self._request(pod, "PodFailed", int(terminated.get("exitCode", 0)))
        elif phase == "Succeeded":
            meta = pod["metadata"]
            job = self.job(meta["namespace"], meta["annotations"][JOB_NAME])
            task = meta["annotations"][TASK_SPEC]
            replicas = next(t["replicas"] for t in job["spec"]["tasks"] if t["name"] == task)
            done = [
                p
                for p in self.pods(job)
                if p["metadata"]["annotations"][TASK_SPEC] == task
                and (p.get("status") or {}).get("phase") == "Succeeded"
            ]
            self._request(pod, "TaskCompleted" if len(done) >= replicas else "OutOfSync")
        elif phase == "Running":
            self._request(pod, "PodRunning")

    def pod_deleted(self, pod: dict[str, Any]) -> None:
        """job_controller_handler.go deletePod: PodEvicted (a pod the controller killed is
        of an older version by then, so it only syncs the job)."""
        self._request(pod, "PodEvicted")

    # -- what a test drives -------------------------------------------------------------------
    def pods_running(
        self,
        namespace: str,
        name: str,
        *,
        nodes: list[str] | None = None,
        started: str | None = None,
    ) -> dict[str, Any]:
        """The scheduler binds every pending pod of the job and the kubelets start them."""
        with self.fake.lock:
            pending = [
                p
                for p in self.pods(self.job(namespace, name))
                if (p.get("status") or {}).get("phase", "Pending") == "Pending"
                and not terminating(p)
            ]
            for index, pod in enumerate(sorted(pending, key=lambda p: p["metadata"]["name"])):
                node = (nodes or ["node-0"])[index % len(nodes or ["node-0"])]
                self.fake.pods.run(namespace, pod["metadata"]["name"], node=node, started=started)
            return self.job(namespace, name)

    def pod_failed(
        self, namespace: str, name: str, task: str = "worker", index: int = 0, exit_code: int = 1
    ) -> dict[str, Any]:
        with self.fake.lock:
            self.fake.pods.fail(namespace, f"{name}-{task}-{index}", exit_code)
            return self.job(namespace, name)

    def pods_succeeded(self, namespace: str, name: str) -> dict[str, Any]:
        with self.fake.lock:
            for pod in self.pods(self.job(namespace, name)):
                if (pod.get("status") or {}).get("phase") == "Running" and not terminating(pod):
                    self.fake.pods.succeed(namespace, pod["metadata"]["name"])
            return self.job(namespace, name)
