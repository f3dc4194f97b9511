"""The Kubernetes gang backend: a gang is admitted whole by the cluster's gang scheduler.

Same protocol as the local backend. Per cluster (``KubeSettings.gang_scheduler``)
a gang is a Volcano Job (``volcano``) or a JobSet admitted by Kueue (``kueue``).
The object's name is derived from the gang id, so a retried Airflow task (or a
restarted worker) finds the object it created instead of creating a second one.
Status comes from the object's status; preempting evicts the gang's pods
through the Eviction API (PodDisruptionBudgets hold; the pods get their
termination grace to checkpoint and exit 75, and the gang scheduler restarts
the gang when its queue has room again); cancelling deletes the object and,
in the foreground, its pods.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from tideflow.backends.protocol import GangJob, GangState, GangStatus
from tideflow.kube.jobset import gang_jobset
from tideflow.kube.names import dns_label, gang_object_name
from tideflow.kube.volcano import GangShape, KubeSettings, gang_volcano_job

VOLCANO_PHASES = {
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


def _volcano_status(gang_id: str, obj: dict[str, Any]) -> GangStatus:
    status = obj.get("status") or {}
    state = status.get("state") or {}
    phase = state.get("phase", "Pending")
    return GangStatus(
        gang_id,
        VOLCANO_PHASES.get(phase, GangState.PENDING),
        int(status.get("retryCount", 0)),
        state.get("message", "") or phase,
    )


def _jobset_status(gang_id: str, obj: dict[str, Any]) -> GangStatus:
    status = obj.get("status") or {}
    conditions = {
        c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"
    }
    restarts = int(status.get("restarts", 0))
    for kind, state in (("Completed", GangState.SUCCEEDED), ("Failed", GangState.FAILED)):
        if kind in conditions:
            message = conditions[kind].get("message") or kind
            return GangStatus(gang_id, state, restarts, message)
    if "Suspended" in conditions:  # Kueue has not admitted it (yet): no pod runs
        message = conditions["Suspended"].get("message") or "waiting for Kueue admission"
        return GangStatus(gang_id, GangState.PENDING, restarts, message)
    active = sum(int(j.get("active", 0)) for j in status.get("replicatedJobsStatus") or [])
    state = GangState.RUNNING if active else GangState.PENDING
    return GangStatus(gang_id, state, restarts, "running" if active else "pending")


@dataclass(frozen=True)
class GangKind:
    """Where a gang scheduler's objects live and how their status reads."""

    group: str
    version: str
    plural: str
    build: Callable[[GangShape, str, KubeSettings], dict[str, Any]]
    read_status: Callable[[str, dict[str, Any]], GangStatus]


GANG_KINDS = {
    "volcano": GangKind("batch.volcano.sh", "v1alpha1", "jobs", gang_volcano_job, _volcano_status),
    "kueue": GangKind("jobset.x-k8s.io", "v1alpha2", "jobsets", gang_jobset, _jobset_status),
}


def gang_kind(scheduler: str) -> GangKind:
    if scheduler not in GANG_KINDS:
        raise ValueError(
            f"gang scheduler {scheduler!r} is not supported; accepted: {', '.join(GANG_KINDS)}"
        )
    return GANG_KINDS[scheduler]


class KubernetesBackend:
    def __init__(self, api_client: Any, settings: KubeSettings) -> None:
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.settings = settings
        self.kind = gang_kind(settings.gang_scheduler)

    def job_name(self, gang_id: str) -> str:
        return gang_object_name(gang_id, self.settings.gang_scheduler)

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
        return self.kind.build(shape, job.gang_id, self.settings)

    def _get(self, gang_id: str) -> dict[str, Any] | None:
        from kubernetes.client.rest import ApiException

        try:
            found: dict[str, Any] = self.custom.get_namespaced_custom_object(
                *self._where(), self.job_name(gang_id)
            )
            return found
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _where(self) -> tuple[str, str, str, str]:
        return self.kind.group, self.kind.version, self.settings.namespace, self.kind.plural

    def _status(self, gang_id: str, obj: dict[str, Any]) -> GangStatus:
        return self.kind.read_status(gang_id, obj)

    def submit(self, job: GangJob) -> GangStatus:
        from kubernetes.client.rest import ApiException

        existing = self._get(job.gang_id)
        if existing is not None:  # a retried task reattaches; never a second Job
            return self._status(job.gang_id, existing)
        try:
            created = self.custom.create_namespaced_custom_object(
                *self._where(), self.manifest(job)
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
                *self._where(), self.job_name(gang_id), propagation_policy="Foreground"
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


async def follow(
    api_client: Any, settings: KubeSettings, gang_id: str, *, timeout_s: float
) -> AsyncIterator[GangStatus | None]:
    """The gang's status now, then at every change, through a watch (``kubernetes_asyncio``).

    Lists the one object by name for its current state and resourceVersion,
    then watches from there; a watch that ends (server timeout, a 410 Gone
    after compaction, a dropped connection) is answered by listing again, so
    no change is missed and nothing is polled. Yields None when the object
    does not exist or is deleted. Ends after ``timeout_s`` (the watch's own
    server-side timeout): the caller checks its deadline and calls again.
    """
    import asyncio

    from kubernetes_asyncio import client, watch
    from kubernetes_asyncio.client.exceptions import ApiException

    kind = gang_kind(settings.gang_scheduler)
    custom = client.CustomObjectsApi(api_client)
    where = (kind.group, kind.version, settings.namespace, kind.plural)
    selector = f"metadata.name={gang_object_name(gang_id, settings.gang_scheduler)}"
    loop = asyncio.get_running_loop()
    until = loop.time() + timeout_s
    while loop.time() < until:
        listing = await custom.list_namespaced_custom_object(*where, field_selector=selector)
        items = listing.get("items") or []
        if not items:
            yield None
            return
        yield kind.read_status(gang_id, items[0])
        version = (listing.get("metadata") or {}).get("resourceVersion")
        stream = watch.Watch().stream(
            custom.list_namespaced_custom_object,
            *where,
            field_selector=selector,
            resource_version=version,
            timeout_seconds=max(1, int(until - loop.time())),
        )
        try:
            async with stream as events:
                async for event in events:
                    if event["type"] == "DELETED":
                        yield None
                        return
                    if event["type"] in ("ADDED", "MODIFIED"):
                        yield kind.read_status(gang_id, event["raw_object"])
        except ApiException as exc:
            if exc.status != 410:  # 410 Gone: our version was compacted; list again
                raise
