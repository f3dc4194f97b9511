"""The admission chain every create, update and patch goes through, in the API server's order.

1. NamespaceLifecycle; CRD structural defaulting (applied when the body is decoded);
2. mutating admission: the Volcano Job mutating webhook, the JobSet and Kueue
   defaulting webhooks, the Priority plugin for pods;
3. object validation: every object's metadata (name, labels), then the CRD schema +
   CEL rules, or the core OpenAPI schema;
4. validating admission: ValidatingAdmissionPolicies, then the Volcano Job and Queue,
   JobSet and Kueue validating webhooks.

A webhook registered for CREATE only (Volcano's mutating webhook, the defaulting
webhooks) is not called on an update, as upstream's webhook configurations say.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tests.kubefake import (
    core_admission,
    jobset_webhooks,
    kueue_webhooks,
    volcano_queue_webhook,
    volcano_webhooks,
)
from tests.kubefake.object_meta import object_meta_problems
from tests.kubefake.resources import BY_KIND, RequestInfo, Resource
from tests.kubefake.schemas import validator
from tests.kubefake.status import invalid, webhook_denied

if TYPE_CHECKING:
    from tests.kubefake.store import Store

VOLCANO_JOB = ("batch.volcano.sh", "jobs")
VOLCANO_QUEUE = ("scheduling.volcano.sh", "queues")
JOBSET = ("jobset.x-k8s.io", "jobsets")
KUEUE_CLUSTER_QUEUE = ("kueue.x-k8s.io", "clusterqueues")
KUEUE_COHORT = ("kueue.x-k8s.io", "cohorts")


def _queues(store: Store) -> Any:
    return lambda: store.list(BY_KIND[("scheduling.volcano.sh/v1beta1", "Queue")])[0]


def _default_local_queue(store: Store, namespace: str) -> bool:
    resource = BY_KIND[("kueue.x-k8s.io/v1beta2", "LocalQueue")]
    return store.get(resource, namespace, "default") is not None


def mutate(store: Store, resource: Resource, operation: str, obj: dict[str, Any]) -> dict[str, Any]:
    which = (resource.group, resource.plural)
    obj = validator(resource).default(obj)
    if operation != "CREATE":
        return obj
    if which == VOLCANO_JOB:
        obj = volcano_webhooks.mutate_job(obj)
    elif which == JOBSET:
        obj = jobset_webhooks.default_jobset(obj)
        namespace = obj["metadata"].get("namespace", "")
        obj = jobset_webhooks.kueue_default(obj, _default_local_queue(store, namespace))
    elif which == ("", "pods"):
        obj = core_admission.priority(store, obj)
    return obj


def validate(
    store: Store,
    info: RequestInfo,
    operation: str,
    obj: dict[str, Any],
    old: dict[str, Any] | None,
    *,
    user: str,
) -> None:
    resource = info.resource
    problems = object_meta_problems(obj)
    if problems:
        name = (obj.get("metadata") or {}).get("name", "")
        raise invalid(resource.kind, resource.group, name, problems)
    validator(resource).check(obj, old)
    if old is not None:
        core_admission.admission_policies(store, info, operation, old=old, new=obj, user=user)
    which = (resource.group, resource.plural)
    if which == VOLCANO_JOB:
        message = (
            volcano_webhooks.validate_job_create(obj, _queues(store))
            if old is None
            else volcano_webhooks.validate_job_update(old, obj)
        )
        if message:
            raise webhook_denied(volcano_webhooks.JOB_VALIDATE, 400, message)
    elif which == VOLCANO_QUEUE:
        message = volcano_queue_webhook.validate_queue(obj, old, _queues(store))
        if message:
            raise webhook_denied(volcano_queue_webhook.QUEUE_VALIDATE, 400, message)
    elif which == JOBSET:
        causes = (
            jobset_webhooks.validate_jobset_create(obj)
            if old is None
            else jobset_webhooks.validate_jobset_update(old, obj)
        )
        if causes:
            raise jobset_webhooks.jobset_refusal(obj["metadata"]["name"], causes)
        refused = jobset_webhooks.kueue_validate_create(obj)
        if refused:
            raise jobset_webhooks.kueue_refusal(refused)
    elif which == KUEUE_CLUSTER_QUEUE:  # on create and update (clusterqueue_webhook.go)
        message = kueue_webhooks.validate_cluster_queue(obj)
        if message:
            raise webhook_denied(kueue_webhooks.CLUSTER_QUEUE_VALIDATE, 403, message, "Forbidden")
    elif which == KUEUE_COHORT:
        message = kueue_webhooks.validate_cohort(obj)
        if message:
            raise webhook_denied(kueue_webhooks.COHORT_VALIDATE, 403, message, "Forbidden")


def admit(
    store: Store,
    info: RequestInfo,
    obj: dict[str, Any],
    old: dict[str, Any] | None,
    user: str,
) -> dict[str, Any]:
    """The object as it will be stored, or ApiError as the API server refuses it."""
    operation = "CREATE" if old is None else "UPDATE"
    if old is None:
        core_admission.namespace_lifecycle(store, info)
    obj = mutate(store, info.resource, operation, obj)
    validate(store, info, operation, obj, old, user=user)
    return obj
