"""The Kubernetes gang backend: a gang is admitted whole by the cluster's gang scheduler.

Same protocol as the local backend. Per cluster (``KubeSettings.gang_scheduler``)
a gang is a Volcano Job (``volcano``) or a JobSet admitted by Kueue (``kueue``).
The object's name is derived from the gang id, so a retried Airflow task (or a
restarted worker) finds the object it created instead of creating a second one.
Status comes from the object's status; preempting evicts the gang's pods
through the Eviction API (PodDisruptionBudgets hold; the pods get their
termination grace to checkpoint and exit 75); cancelling deletes the object
and, in the foreground, its pods.

A preemption never uses up one of the gang's restarts. JobSet restarts it in
place without counting (``RestartJobSetAndIgnoreMaxRestarts``). Volcano has no
such action, so a preempted Volcano Job is aborted (``tideflow.kube.volcano``),
reads as PREEMPTED, and the next ``submit`` replaces it: the aborted Job is
deleted and a new one with the same name allows only the restarts the gang has
left (it carries the count used so far in an annotation). ``submit`` replaces a
failed or cancelled object the same way, with all restarts: that is a retry's
new attempt. A pending, running or succeeded one is kept, so there is never a
second gang.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from tideflow.backends.protocol import GangJob, GangState, GangStatus
from tideflow.kube import volcano_lineage
from tideflow.kube.jobset import gang_jobset
from tideflow.kube.names import gang_object_name
from tideflow.kube.settings import KubeSettings
from tideflow.kube.volcano import RESTARTS_USED, GangShape, gang_volcano_job
from tideflow.steps.context import gang_selector

VOLCANO_PHASES = {
    "Pending": GangState.PENDING,
    "Running": GangState.RUNNING,
    "Restarting": GangState.RUNNING,
    "Completing": GangState.RUNNING,
    "Completed": GangState.SUCCEEDED,
    "Failed": GangState.FAILED,
    "Terminating": GangState.FAILED,
    "Terminated": GangState.FAILED,
    # Only the preemption policies abort a gang (tideflow.kube.volcano); cancelling
    # deletes the Job instead.
    "Aborting": GangState.RUNNING,
    "Aborted": GangState.PREEMPTED,
}
# States in which ``submit`` keeps the existing object instead of replacing it.
KEPT = (GangState.PENDING, GangState.RUNNING, GangState.SUCCEEDED)
# How long ``submit`` waits for a replaced Job's foreground deletion (its pods have
# already stopped, so only the garbage collector's removal of them is left).
REPLACE_WAIT_S = 120.0
# Deletes of a replaced object that found it changed since it was read (409), read again.
DELETE_ATTEMPTS = 5


def restarts_used(obj: dict[str, Any]) -> int:
    """Restarts a gang has used: earlier incarnations' (annotated) plus this Job's."""
    carried = int(((obj.get("metadata") or {}).get("annotations") or {}).get(RESTARTS_USED, 0))
    status = obj.get("status") or {}
    retries = int(status.get("retryCount", 0))
    if (status.get("state") or {}).get("phase") == "Failed" and retries:
        # The restart that found retryCount at maxRetry failed the job instead
        # (volcano state/restarting.go): it was counted but never ran.
        retries -= 1
    return carried + retries


def _volcano_status(gang_id: str, obj: dict[str, Any]) -> GangStatus:
    state = (obj.get("status") or {}).get("state") or {}
    phase = state.get("phase", "Pending")
    message = state.get("message", "") or phase
    if phase == "Aborted":
        message = "preempted; resumes when submitted again, without using a restart"
    return GangStatus(
        gang_id, VOLCANO_PHASES.get(phase, GangState.PENDING), restarts_used(obj), message
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
    build: Callable[..., dict[str, Any]]  # (shape, gang_id, settings, *, restarts_used)
    read_status: Callable[[str, dict[str, Any]], GangStatus]


GANG_KINDS = {
    "volcano": GangKind("batch.volcano.sh", "v1alpha1", "jobs", gang_volcano_job, _volcano_status),
    "kueue": GangKind("jobset.x-k8s.io", "v1alpha2", "jobsets", gang_jobset, _jobset_status),
}


def gang_object(job: GangJob, settings: KubeSettings, *, restarts_used: int = 0) -> dict[str, Any]:
    """The Volcano Job or JobSet (by ``settings.gang_scheduler``) that runs ``job``."""
    per_worker = max((len(s.devices) for s in job.slots), default=1) or 1
    shape = GangShape(
        name=gang_object_name(job.gang_id, settings.gang_scheduler),
        labels=dict(job.labels),
        command=list(job.command),
        env=dict(job.env),
        workers=job.workers,
        device_class=job.device_class,
        devices_per_worker=per_worker,
        model=job.model,
        team=job.team,
        priority=job.priority,
        priority_class=job.priority_class,
        max_restarts=job.max_restarts,
        image=job.image,
        cpu=job.cpu,
        memory=job.memory,
        step_files=dict(job.step_files),
    )
    kind = gang_kind(settings.gang_scheduler)
    if restarts_used:
        return kind.build(shape, job.gang_id, settings, restarts_used=restarts_used)
    return kind.build(shape, job.gang_id, settings)


def gang_kind(scheduler: str) -> GangKind:
    if scheduler not in GANG_KINDS:
        raise ValueError(
            f"gang scheduler {scheduler!r} is not supported; accepted: {', '.join(GANG_KINDS)}"
        )
    return GANG_KINDS[scheduler]


class KubernetesBackend:
    def __init__(self, api_client: Any, settings: KubeSettings, *, owner: Any = None) -> None:
        """``owner``: a ``V1OwnerReference`` every gang object gets (an Argo workflow's
        gang step: deleting the workflow deletes its gangs)."""
        from kubernetes import client

        self.api_client = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.settings = settings
        self.kind = gang_kind(settings.gang_scheduler)
        self.owner = owner

    def job_name(self, gang_id: str) -> str:
        return gang_object_name(gang_id, self.settings.gang_scheduler)

    def manifest(
        self, job: GangJob, *, restarts_used: int = 0, carried: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """``carried``: annotations a replaced Volcano Job hands on (its gang's stops,
        ``tideflow.kube.volcano_lineage``)."""
        built = gang_object(job, self.settings, restarts_used=restarts_used)
        if carried:
            built["metadata"].setdefault("annotations", {}).update(carried)
        if self.owner is not None:
            owner = self.api_client.sanitize_for_serialization(self.owner)
            built["metadata"]["ownerReferences"] = [owner]
        return built

    def _get(self, gang_id: str) -> dict[str, Any] | None:
        return self._get_by_name(self.job_name(gang_id))

    def _get_by_name(self, name: str) -> dict[str, Any] | None:
        from kubernetes.client.rest import ApiException

        try:
            found: dict[str, Any] = self.custom.get_namespaced_custom_object(*self._where(), name)
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
        used, carried = 0, None
        if existing is not None:
            status = self._status(job.gang_id, existing)
            if status.state in KEPT:  # a retried task reattaches; never a second gang
                return status
            # Preempted: it resumes with the restarts it has left. Failed or cancelled:
            # this is a new attempt (an Airflow or Argo retry), with all of them.
            used = restarts_used(existing) if status.state is GangState.PREEMPTED else 0
            deleted = self._delete_and_wait(existing)
            if self.settings.gang_scheduler == "volcano":
                # Either way the gang's stops so far go on (the broker's lost-work budget
                # counts them per gang, not per Job), as the deleted version had them.
                carried = volcano_lineage.carried(deleted)
        try:
            created = self.custom.create_namespaced_custom_object(
                *self._where(), self.manifest(job, restarts_used=used, carried=carried)
            )
        except ApiException as exc:
            if exc.status != 409:  # 409: created meanwhile by another attempt
                raise
            created = self._get(job.gang_id) or {}
        return self._status(job.gang_id, created)

    def _delete_and_wait(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Delete a preempted gang's object (only that one: by uid) and wait until it is
        gone; the version deleted. The delete names the version read too, so a change
        made since (the broker taking back its stop mark) is read again before the
        count it carries is copied."""
        import time

        from kubernetes import client
        from kubernetes.client.rest import ApiException

        meta = obj["metadata"]
        for _ in range(DELETE_ATTEMPTS):
            try:
                self.custom.delete_namespaced_custom_object(
                    *self._where(),
                    meta["name"],
                    body=client.V1DeleteOptions(
                        propagation_policy="Foreground",
                        preconditions=client.V1Preconditions(
                            uid=meta["uid"], resource_version=meta.get("resourceVersion")
                        ),
                    ),
                )
                break
            except ApiException as exc:
                if exc.status == 404:  # gone
                    return obj
                if exc.status != 409:
                    raise
                current = self._get_by_name(meta["name"])
                if current is None or current["metadata"]["uid"] != meta["uid"]:
                    return obj  # replaced by another attempt
                obj, meta = current, current["metadata"]  # changed: delete what it is now
        else:
            raise RuntimeError(
                f"gang object {meta['name']} kept changing while it was being replaced"
            )
        deadline = time.monotonic() + REPLACE_WAIT_S
        while time.monotonic() < deadline:
            current = self._get_by_name(meta["name"])
            if current is None or current["metadata"]["uid"] != meta["uid"]:
                return obj
            time.sleep(0.5)
        raise TimeoutError(
            f"gang object {meta['name']} was still being deleted after {REPLACE_WAIT_S:.0f}s; "
            "its pods may be stuck terminating"
        )

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
            self.settings.namespace, label_selector=gang_selector(gang_id)
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
