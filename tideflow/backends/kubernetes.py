"""The Kubernetes gang backend: a gang is a Volcano Job, admitted whole or not at all.

Same protocol as the local backend. The Job's name is derived from the gang id,
so a retried Airflow task (or a restarted worker) finds the Job it created
instead of creating a second one. Status comes from the Job's ``status.state``;
preempting evicts the gang's pods through the Eviction API (they get their
termination grace to checkpoint and exit 75, and Volcano restarts the gang when
its queue has room again); cancelling deletes the Job and its pods.
"""

from __future__ import annotations

from typing import Any

from tideflow.backends.protocol import GangJob, GangState, GangStatus
from tideflow.kube.names import dns_label
from tideflow.kube.volcano import GangShape, KubeSettings, gang_volcano_job

GROUP, VERSION, PLURAL = "batch.volcano.sh", "v1alpha1", "jobs"
PHASES = {
    "Pending": GangState.PENDING,
    "Running": GangState.RUNNING,
    "Restarting": GangState.RUNNING,
    "Completing": GangState.RUNNING,
    "Completed": GangState.SUCCEEDED,
    "Failed": GangState.FAILED,
    "Terminating": GangState.FAILED,
    "Terminated": GangState.FAILED,
    "Aborting": GangState.CANCELLED,
    "Aborted": GangState.CANCELLED,
}


class KubernetesBackend:
    def __init__(self, api_client: Any, settings: KubeSettings) -> None:
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.settings = settings

    def job_name(self, gang_id: str) -> str:
        return dns_label(gang_id, limit=47)

    def manifest(self, job: GangJob) -> dict[str, Any]:
        per_worker = max((len(s.devices) for s in job.slots), default=1) or 1
        shape = GangShape(
            name=self.job_name(job.gang_id),
            labels={},
            command=list(job.command),
            env=dict(job.env),
            workers=job.workers,
            device_class=job.device_class,
            devices_per_worker=per_worker,
            model=job.model,
            team=job.team,
            priority=job.priority,
            max_restarts=job.max_restarts,
        )
        return gang_volcano_job(shape, job.gang_id, self.settings)

    def _get(self, gang_id: str) -> dict[str, Any] | None:
        from kubernetes.client.rest import ApiException

        try:
            found: dict[str, Any] = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.settings.namespace, PLURAL, self.job_name(gang_id)
            )
            return found
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _status(self, gang_id: str, obj: dict[str, Any]) -> GangStatus:
        status = obj.get("status") or {}
        phase = (status.get("state") or {}).get("phase", "Pending")
        message = (status.get("state") or {}).get("message", "") or phase
        return GangStatus(
            gang_id,
            PHASES.get(phase, GangState.PENDING),
            int(status.get("retryCount", 0)),
            message,
        )

    def submit(self, job: GangJob) -> GangStatus:
        from kubernetes.client.rest import ApiException

        existing = self._get(job.gang_id)
        if existing is not None:  # a retried task reattaches; never a second Job
            return self._status(job.gang_id, existing)
        try:
            created = self.custom.create_namespaced_custom_object(
                GROUP, VERSION, self.settings.namespace, PLURAL, self.manifest(job)
            )
        except ApiException as exc:
            if exc.status != 409:  # 409: created meanwhile by another attempt
                raise
            created = self._get(job.gang_id) or {}
        return self._status(job.gang_id, created)

    def status(self, gang_id: str) -> GangStatus | None:
        found = self._get(gang_id)
        return None if found is None else self._status(gang_id, found)

    def reattach(self, gang_id: str) -> GangStatus | None:
        status = self.status(gang_id)
        return status if status is not None and not status.state.finished else None

    def cancel(self, gang_id: str) -> None:
        from kubernetes.client.rest import ApiException

        try:
            self.custom.delete_namespaced_custom_object(
                GROUP,
                VERSION,
                self.settings.namespace,
                PLURAL,
                self.job_name(gang_id),
                propagation_policy="Foreground",
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def preempt(self, gang_id: str) -> None:
        from kubernetes import client

        pods = self.core.list_namespaced_pod(
            self.settings.namespace, label_selector=f"tideflow.io/gang={dns_label(gang_id)}"
        ).items
        for pod in pods:
            body = client.V1Eviction(
                metadata=client.V1ObjectMeta(
                    name=pod.metadata.name, namespace=self.settings.namespace
                )
            )
            self.core.create_namespaced_pod_eviction(
                pod.metadata.name, self.settings.namespace, body
            )
