"""Which controller reacts to which change: the fake's informers, in one place."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tests.kubefake.pods import owner_kind
from tests.kubefake.resources import Resource
from tests.kubefake.status import ApiError

if TYPE_CHECKING:
    from tests.kubefake.fake import KubeFake


class ControllerError(RuntimeError):
    """A controller's own write was refused: the fake's controller, or the object it was
    given, is wrong (a real controller would retry and report an event)."""


def _reported(method: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(self: Controllers, *args: Any) -> Any:
        try:
            return method(self, *args)
        except ApiError as exc:
            raise ControllerError(f"a controller's write was refused: {exc.message}") from exc

    return wrapper


class Controllers:
    """Hands each change to the controller that reacts to it."""

    def __init__(self, fake: KubeFake) -> None:
        self.fake = fake

    @_reported
    def after_create(self, resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        which = (resource.group, resource.plural)
        if which == ("batch.volcano.sh", "jobs"):
            self.fake.volcano.job_added(obj)
        elif which == ("scheduling.volcano.sh", "queues"):
            self.fake.volcano.queue_added(obj)
        elif which == ("jobset.x-k8s.io", "jobsets"):
            self.fake.jobset.added(obj)
        return obj

    @_reported
    def after_update(self, resource: Resource, new: dict[str, Any], old: dict[str, Any]) -> None:
        if (resource.group, resource.plural) == ("jobset.x-k8s.io", "jobsets"):
            self.fake.jobset.updated(new, old)

    @_reported
    def after_delete(self, resource: Resource, obj: dict[str, Any]) -> None:
        which = (resource.group, resource.plural)
        if which == ("", "pods") and owner_kind(obj) == ("batch.volcano.sh/v1alpha1", "Job"):
            self.fake.volcano.pod_deleted(obj)
        elif which == ("jobset.x-k8s.io", "jobsets"):
            self.fake.kueue.release(obj)

    @_reported
    def pod_changed(self, pod: dict[str, Any]) -> None:
        owner = owner_kind(pod)
        if owner == ("batch.volcano.sh/v1alpha1", "Job"):
            self.fake.volcano.pod_changed(pod)
        elif owner == ("batch/v1", "Job"):
            self.fake.jobs.pod_changed(pod)
