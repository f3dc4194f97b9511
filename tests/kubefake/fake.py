"""KubeFake: the store, the API, admission, authorization and the controllers, wired together."""

from __future__ import annotations

import copy
import json
import secrets
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.kubefake import admission
from tests.kubefake import resources as res
from tests.kubefake.api import Api
from tests.kubefake.batch_jobs import Jobs
from tests.kubefake.controllers import Controllers
from tests.kubefake.jobset import JobSets
from tests.kubefake.kueue import Kueue
from tests.kubefake.pods import Pods
from tests.kubefake.rbac import ADMIN, Authorizer
from tests.kubefake.resources import BY_KIND, RequestInfo, Resource, resource_for
from tests.kubefake.schemas import validator
from tests.kubefake.status import ApiError
from tests.kubefake.store import Store, Watcher
from tests.kubefake.volcano import Volcano

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
ANONYMOUS = "system:anonymous"
CONTROLLER = "system:serviceaccount:kube-system:controllers"  # the controllers' writes


@dataclass(frozen=True)
class Logged:
    """One request as the fake saw it: who asked what, and the code it answered."""

    method: str
    path: str
    user: str
    verb: str
    resource: str  # <resource>[/<subresource>], as RBAC names it
    group: str
    namespace: str
    name: str
    code: int
    content_type: str
    body: Any


def path_for(resource: Resource, namespace: str = "", name: str = "", sub: str = "") -> str:
    base = f"/apis/{resource.group}/{resource.version}" if resource.group else "/api/v1"
    if resource.namespaced and namespace:
        base += f"/namespaces/{namespace}"
    base += f"/{resource.plural}"
    if name:
        base += f"/{name}"
    return base + (f"/{sub}" if sub else "")


def documents(*sources: Path | dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for source in sources:
        if isinstance(source, dict):
            found.append(copy.deepcopy(source))
        else:
            found += [d for d in yaml.safe_load_all(Path(source).read_text()) if d]
    return found


class KubeFake:
    def __init__(
        self,
        *,
        rbac: Iterable[Path] | None = None,
        watch_window: int = 1000,
        namespaces: Iterable[str] = ("tideflow",),
    ) -> None:
        self.store = Store(watch_window)
        self.rbac = Authorizer.from_paths(
            sorted(DEPLOY.glob("*.yaml")) if rbac is None else list(rbac)
        )
        self.api = Api(self)
        self.pods = Pods(self)
        self.volcano = Volcano(self)
        self.jobs = Jobs(self)
        self.jobset = JobSets(self)
        self.kueue = Kueue(self)
        self.controllers = Controllers(self)
        self.requests: list[Logged] = []
        self._tokens: dict[str, str] = {}
        self._watch_steps: deque[Callable[[RequestInfo], None]] = deque()
        self.lock = threading.RLock()
        self.server: Any = None
        for namespace in namespaces:
            self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})

    # -- serving ---------------------------------------------------------------------------
    def start(self) -> KubeFake:
        from tests.kubefake.server import serve

        self.server = serve(self)
        return self

    def stop(self) -> None:
        self.store.close_all()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def __enter__(self) -> KubeFake:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    # -- identities ------------------------------------------------------------------------
    def token(self, user: str) -> str:
        """A bearer token the fake maps to ``user`` (a ServiceAccount's user name, or ADMIN)."""
        with self.lock:
            for token, owner in self._tokens.items():
                if owner == user:
                    return token
            token = secrets.token_hex(8)
            self._tokens[token] = user
            return token

    def authenticate(self, header: str | None) -> str:
        if not header:
            return ANONYMOUS
        token = header.removeprefix("Bearer ").strip()
        if token not in self._tokens:
            raise ApiError(401, "Unauthorized")
        return self._tokens[token]

    def client(self, user: str = ADMIN) -> Any:
        """An official ``kubernetes`` ApiClient that talks to the fake as ``user``."""
        from kubernetes import client

        config = client.Configuration()
        config.host = self.url
        config.api_key = {"authorization": self.token(user)}
        config.api_key_prefix = {"authorization": "Bearer"}
        return client.ApiClient(config)

    def async_configuration(self, user: str = ADMIN) -> Any:
        """A ``kubernetes_asyncio`` Configuration that talks to the fake as ``user``."""
        from kubernetes_asyncio import client

        config = client.Configuration(host=self.url)
        config.api_key = {"BearerToken": self.token(user)}
        config.api_key_prefix = {"BearerToken": "Bearer"}
        return config

    def kubeconfig(self, path: Path, user: str, namespace: str = "tideflow") -> Path:
        """A kubeconfig file for ``user``, as either client library reads it."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": user, "user": {"token": self.token(user)}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": user, "namespace": namespace},
                }
            ],
            "current-context": "fake",
        }
        path.write_text(json.dumps(config))
        return path

    # -- the API, in process ---------------------------------------------------------------
    def _log(
        self,
        *,
        method: str,
        path: str,
        user: str,
        info: RequestInfo | None,
        code: int,
        content_type: str,
        body: Any,
    ) -> None:
        with self.lock:
            self.requests.append(
                Logged(
                    method,
                    path,
                    user,
                    info.verb if info else "",
                    info.rbac_resource if info else "",
                    info.resource.group if info else "",
                    info.namespace if info else "",
                    info.name if info else "",
                    code,
                    content_type,
                    copy.deepcopy(body),
                )
            )

    def request(
        self,
        method: str,
        path: str,
        *,
        user: str = ADMIN,
        body: Any = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        """Serve one request; the answer's code and body (a Status for a refusal)."""
        info = None
        try:
            info = res.parse(method, path)
            with self.lock:
                code, answer = self.api.handle(info, user, content_type, body)
        except res.NoRouteError:
            code, answer = 404, ApiError(404, f"the server could not find {path}").body
        except ApiError as exc:
            code, answer = exc.code, exc.body
        self._log(
            method=method,
            path=path,
            user=user,
            info=info,
            code=code,
            content_type=content_type,
            body=body,
        )
        return code, answer

    def open_watch(self, path: str, user: str) -> tuple[Watcher, RequestInfo]:
        """Start a watch (the server streams it); ApiError for a refusal or a 410."""
        info = res.parse("GET", path)
        try:
            self.rbac.authorize(user, info)
            with self.lock:
                step = self._watch_steps.popleft() if self._watch_steps else None
                if step is not None:
                    step(info)
            since = info.query.get("resourceVersion")
            watcher = self.store.watch(
                info.resource,
                info.namespace,
                info.query.get("labelSelector", ""),
                info.query.get("fieldSelector", ""),
                int(since) if since else None,
            )
        except ApiError as exc:
            self._log(
                method="GET",
                path=path,
                user=user,
                info=info,
                code=exc.code,
                content_type="",
                body=None,
            )
            raise
        self._log(
            method="GET", path=path, user=user, info=info, code=200, content_type="", body=None
        )
        return watcher, info

    def when_watched(self, *steps: Callable[[RequestInfo], None]) -> None:
        """Run one step (the controllers' next move) when each of the next watches opens."""
        self._watch_steps.extend(steps)

    def create(self, obj: dict[str, Any], user: str = ADMIN) -> dict[str, Any]:
        resource = resource_for(obj)
        namespace = (obj.get("metadata") or {}).get("namespace", "tideflow")
        code, answer = self.request(
            "POST",
            path_for(resource, namespace if resource.namespaced else ""),
            user=user,
            body=obj,
        )
        if code >= 400:
            raise ApiError(
                code, answer["message"], reason=answer.get("reason"), details=answer.get("details")
            )
        return dict(answer)

    def apply(self, *sources: Path | dict[str, Any], user: str = ADMIN) -> list[dict[str, Any]]:
        """Create every document of the given files (or objects), as ``kubectl create``."""
        return [self.create(doc, user) for doc in documents(*sources)]

    def seed(self, *sources: Path | dict[str, Any]) -> list[dict[str, Any]]:
        """Store objects the cluster already holds: schema-checked, but neither authorized
        nor sent through webhooks (for state a test is not about)."""
        stored = []
        for doc in documents(*sources):
            resource = resource_for(doc)
            if resource.namespaced:
                doc["metadata"].setdefault("namespace", "tideflow")
            obj = validator(resource).default(doc)
            validator(resource).check(obj)
            status = obj.pop("status", None)
            created = self.store.create(resource, obj)
            created = self.controllers.after_create(resource, created)
            if status is not None:
                created = self.write_status(resource, created, status)
            stored.append(created)
        return stored

    def get(self, api_version: str, kind: str, name: str, namespace: str = "tideflow") -> Any:
        resource = BY_KIND[(api_version, kind)]
        return self.store.get(resource, namespace if resource.namespaced else "", name)

    def list(
        self, api_version: str, kind: str, namespace: str = "", label_selector: str = ""
    ) -> list[dict[str, Any]]:
        return self.store.list(BY_KIND[(api_version, kind)], namespace, label_selector)[0]

    def internal_create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """A controller's create: admitted and validated as any create, but neither
        authorized (controllers' own RBAC is not modelled) nor logged."""
        resource = resource_for(obj)
        meta = obj["metadata"]
        namespace = meta.get("namespace", "") if resource.namespaced else ""
        if not meta.get("name") and meta.get("generateName"):
            from tests.kubefake.api import _suffix

            meta["name"] = meta["generateName"] + _suffix()
        info = RequestInfo("create", resource, namespace, meta["name"])
        with self.lock:
            obj = admission.admit(self.store, info, obj, None, CONTROLLER)
            created = self.store.create(resource, obj)
            return self.controllers.after_create(resource, created)

    def internal_update(self, obj: dict[str, Any]) -> dict[str, Any]:
        """A controller's update of an object's spec, admitted as any update."""
        resource = resource_for(obj)
        meta = obj["metadata"]
        namespace = meta.get("namespace", "") if resource.namespaced else ""
        info = RequestInfo("update", resource, namespace, meta["name"])
        with self.lock:
            old = self.store.get(resource, namespace, meta["name"])
            obj = admission.admit(self.store, info, obj, old, CONTROLLER)
            updated = self.store.update(resource, obj)
            self.controllers.after_update(resource, updated, old)
            return updated

    def write_status(
        self, resource: Resource, obj: dict[str, Any], status: dict[str, Any]
    ) -> dict[str, Any]:
        """A write to the status subresource (controllers, kubelets, test setup)."""
        current = self.store.get(
            resource, obj["metadata"].get("namespace", ""), obj["metadata"]["name"]
        )
        if current is None:
            raise KeyError(obj["metadata"]["name"])
        current["status"] = copy.deepcopy(status)
        return self.store.update(resource, current)

    def set_status(self, obj: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """Write an object's status as its controller would (a budget's disruptionsAllowed,
        a node's allocatable)."""
        return self.write_status(resource_for(obj), obj, status)

    # -- hooks the API calls ---------------------------------------------------------------
    def after_create(self, resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        return self.controllers.after_create(resource, obj)

    def after_update(self, resource: Resource, new: dict[str, Any], old: dict[str, Any]) -> None:
        self.controllers.after_update(resource, new, old)

    def after_delete(self, resource: Resource, obj: dict[str, Any]) -> None:
        self.controllers.after_delete(resource, obj)

    # -- what tests ask of the log ---------------------------------------------------------
    def requests_by(self, user: str) -> list[Logged]:
        return [r for r in self.requests if r.user == user]
