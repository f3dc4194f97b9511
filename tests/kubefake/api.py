"""Requests, served as the API server serves them: authorize, admit, store, answer.

Semantics (Kubernetes "API Concepts"): create answers 201 or 409 AlreadyExists;
get and delete answer 404 for a missing object; an update or patch that carries a
resourceVersion other than the stored one is a 409 Conflict; the main resource
never changes ``status`` (the status subresource does, for controllers); a
namespaced create takes its namespace from the URL and refuses a body naming
another. Delete honours its preconditions (uid, resourceVersion: 409 Conflict
when either differs) and ``propagationPolicy``: Background and Foreground delete
the object's dependents (by ownerReferences) with it, Orphan leaves them and
drops their owner reference (the garbage collector's work, done at once).
"""

from __future__ import annotations

import copy
import random
import string
from typing import TYPE_CHECKING, Any

from tests.kubefake import admission, eviction
from tests.kubefake.patches import apply_patch
from tests.kubefake.resources import RESOURCES, RequestInfo, Resource
from tests.kubefake.status import ApiError, already_exists, conflict, not_found
from tests.kubefake.store import now

if TYPE_CHECKING:
    from tests.kubefake.fake import KubeFake


def _suffix() -> str:
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=5))


class Api:
    def __init__(self, fake: KubeFake) -> None:
        self.fake = fake
        self.store = fake.store

    def handle(self, info: RequestInfo, user: str, content_type: str, body: Any) -> tuple[int, Any]:
        self.fake.rbac.authorize(user, info)
        if info.subresource == "eviction":
            if info.verb != "create":
                raise ApiError(405, "the eviction subresource only accepts create")
            return 201, eviction.evict(self.fake, info, body)
        if info.subresource == "scale":
            return self._scale(info, user, content_type, body)
        if info.subresource == "status":
            return self._status(info, content_type, body)
        handler = {
            "get": self._get,
            "list": self._list,
            "create": self._create,
            "update": self._update,
            "patch": self._patch,
            "delete": self._delete,
        }.get(info.verb)
        if handler is None:
            raise ApiError(405, f"the fake does not serve {info.verb}")
        return handler(info, user, content_type, body)

    # -- reads -----------------------------------------------------------------------------
    def current(self, info: RequestInfo) -> dict[str, Any]:
        found = self.store.get(info.resource, info.namespace, info.name)
        if found is None:
            raise not_found(info.resource.plural, info.resource.group, info.name)
        return found

    def _get(self, info: RequestInfo, *_: Any) -> tuple[int, Any]:
        return 200, self.current(info)

    def _list(self, info: RequestInfo, *_: Any) -> tuple[int, Any]:
        items, version = self.store.list(
            info.resource,
            info.namespace,
            info.query.get("labelSelector", ""),
            info.query.get("fieldSelector", ""),
        )
        return 200, {
            "kind": f"{info.resource.kind}List",
            "apiVersion": info.resource.api_version,
            "metadata": {"resourceVersion": str(version)},
            "items": items,
        }

    # -- writes ----------------------------------------------------------------------------
    def _create(self, info: RequestInfo, user: str, _ct: str, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "the body of the request is not an object")
        obj = copy.deepcopy(body)
        self._check_type(info.resource, obj)
        meta = obj.setdefault("metadata", {})
        if info.resource.namespaced:
            if meta.get("namespace", info.namespace) != info.namespace:
                raise ApiError(
                    400,
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request",
                )
            meta["namespace"] = info.namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + _suffix()
        if not meta.get("name"):
            raise ApiError(422, "name or generateName is required", reason="Invalid")
        for server_set in ("uid", "resourceVersion", "creationTimestamp", "generation"):
            meta.pop(server_set, None)
        obj.pop("status", None)
        if info.resource.plural == "namespaces":
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
        if self.store.get(info.resource, info.namespace, meta["name"]) is not None:
            raise already_exists(info.resource.plural, info.resource.group, meta["name"])
        info = RequestInfo("create", info.resource, info.namespace, meta["name"])
        obj = admission.admit(self.store, info, obj, None, user)
        created = self.store.create(info.resource, obj)
        created = self.fake.after_create(info.resource, created)
        return 201, created

    def _check_type(self, resource: Resource, obj: dict[str, Any]) -> None:
        if obj.get("apiVersion") != resource.api_version or obj.get("kind") != resource.kind:
            raise ApiError(
                400,
                f"the API version in the data ({obj.get('apiVersion')}) and kind "
                f"({obj.get('kind')}) do not match {resource.api_version} {resource.kind}",
            )

    def _write(self, info: RequestInfo, user: str, old: dict[str, Any], new: Any) -> Any:
        if not isinstance(new, dict):
            raise ApiError(400, "the body of the request is not an object")
        self._check_type(info.resource, new)
        sent = (new.get("metadata") or {}).get("resourceVersion")
        if sent and sent != old["metadata"]["resourceVersion"]:
            raise conflict(
                info.resource.plural,
                info.resource.group,
                info.name,
                "the object has been modified; please apply your changes to the latest "
                "version and try again",
            )
        if (new.get("metadata") or {}).get("name") != info.name:
            raise ApiError(400, "the name of the object does not match the name on the URL")
        new = copy.deepcopy(new)
        if "status" in old:
            new["status"] = old["status"]
        else:
            new.pop("status", None)
        for server_set in ("uid", "creationTimestamp", "generation", "namespace"):
            if server_set in old["metadata"]:
                new["metadata"][server_set] = old["metadata"][server_set]
        new = admission.admit(self.store, info, new, old, user)
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        updated = self.store.update(info.resource, new)
        self.fake.after_update(info.resource, updated, old)
        return updated

    def _update(self, info: RequestInfo, user: str, _ct: str, body: Any) -> tuple[int, Any]:
        return 200, self._write(info, user, self.current(info), body)

    def _patch(self, info: RequestInfo, user: str, content_type: str, body: Any) -> tuple[int, Any]:
        old = self.current(info)
        patched = apply_patch(content_type, old, body, custom=info.resource.crd is not None)
        return 200, self._write(info, user, old, patched)

    def _status(self, info: RequestInfo, content_type: str, body: Any) -> tuple[int, Any]:
        old = self.current(info)
        if info.verb == "get":
            return 200, old
        patched = (
            apply_patch(content_type, old, body, custom=info.resource.crd is not None)
            if info.verb == "patch"
            else body
        )
        return 200, self.fake.write_status(info.resource, old, patched.get("status") or {})

    def _scale(self, info: RequestInfo, user: str, content_type: str, body: Any) -> tuple[int, Any]:
        """The scale subresource of a Deployment, as an autoscaling/v1 Scale."""
        deployment = self.current(info)

        def scale(obj: dict[str, Any]) -> dict[str, Any]:
            meta = obj["metadata"]
            return {
                "apiVersion": "autoscaling/v1",
                "kind": "Scale",
                "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion")},
                "spec": {"replicas": obj["spec"].get("replicas", 1)},
                "status": {
                    "replicas": (obj.get("status") or {}).get("replicas", 0),
                    # the Deployment's selector as a string, as the API server reports it
                    # (matchLabels only: the fake's Deployments use no expressions)
                    "selector": ",".join(
                        f"{key}={value}"
                        for key, value in sorted(
                            ((obj["spec"].get("selector") or {}).get("matchLabels") or {}).items()
                        )
                    ),
                },
            }

        if info.verb == "get":
            return 200, scale(deployment)
        if info.verb not in ("patch", "update"):
            raise ApiError(405, f"the scale subresource does not serve {info.verb}")
        wanted = (
            apply_patch(content_type, scale(deployment), body, custom=False)
            if info.verb == "patch"
            else body
        )
        changed = copy.deepcopy(deployment)
        changed["spec"]["replicas"] = wanted["spec"]["replicas"]
        main = RequestInfo("update", info.resource, info.namespace, info.name)
        return 200, scale(self._write(main, user, deployment, changed))

    def _delete(self, info: RequestInfo, _user: str, _ct: str, body: Any) -> tuple[int, Any]:
        found = self.current(info)
        # DeleteOptions.preconditions: a uid or resourceVersion other than the stored
        # one is a 409 Conflict (the registry's checkPreconditions)
        preconditions = (body or {}).get("preconditions") or {}
        for field, held in (
            ("uid", found["metadata"]["uid"]),
            ("resourceVersion", found["metadata"]["resourceVersion"]),
        ):
            wanted = preconditions.get(field)
            if wanted and wanted != held:
                raise conflict(
                    info.resource.plural,
                    info.resource.group,
                    info.name,
                    f"Precondition failed: {field} in precondition: {wanted}, "
                    f"{field} in object meta: {held}",
                )
        policy = info.query.get("propagationPolicy") or (body or {}).get("propagationPolicy")
        self.delete(info.resource, found, policy or "Background")
        if policy == "Foreground":
            found["metadata"]["deletionTimestamp"] = now()
            found["metadata"]["finalizers"] = ["foregroundDeletion"]
        return 200, found

    def delete(self, resource: Resource, obj: dict[str, Any], policy: str = "Background") -> None:
        """Delete ``obj``: a pod gracefully (pods.py), anything else at once with its
        dependents."""
        if (resource.group, resource.plural) == ("", "pods"):
            self.fake.pods.delete(obj)
        else:
            self.remove(resource, obj, policy)

    def remove(self, resource: Resource, obj: dict[str, Any], policy: str = "Background") -> None:
        """Remove ``obj`` from the store and, unless orphaned, delete its dependents (the
        garbage collector). The owner goes first, so no controller acts on dependents of an
        owner being deleted (Foreground deletion would keep the owner, marked, until they
        are gone)."""
        meta = obj["metadata"]
        uid = meta["uid"]
        current = self.store.get(resource, meta.get("namespace", ""), meta["name"])
        if current is None or current["metadata"]["uid"] != uid:
            return
        gone = self.store.delete(resource, meta.get("namespace", ""), meta["name"])
        if gone is None:
            return
        self.fake.after_delete(resource, gone)
        for other_resource in RESOURCES:
            for other in self.store.list(other_resource)[0]:
                owners = other["metadata"].get("ownerReferences") or []
                if not any(o.get("uid") == uid for o in owners):
                    continue
                if policy == "Orphan":
                    kept = [o for o in owners if o.get("uid") != uid]
                    other["metadata"]["ownerReferences"] = kept
                    self.store.update(other_resource, other)
                else:
                    self.delete(other_resource, other, policy)
