"""The resources the fake serves, and a request's attributes read from its URL.

The URL grammar and the verb a request maps to follow the API server's request
info (k8s.io/apiserver pkg/endpoints/request/requestinfo.go, as documented in
"Authorization: request attributes"): ``/api/v1/...`` is the core group,
``/apis/<group>/<version>/...`` the others; ``namespaces/<ns>/`` scopes a
namespaced resource; GET on a collection is ``list`` (``watch`` with
``?watch=true``), GET on a name ``get``, POST ``create``, PUT ``update``, PATCH
``patch``, DELETE ``delete`` (``deletecollection`` on a collection). A list or
watch whose fieldSelector is ``metadata.name=<name>`` is authorized as a request
for that name (the documented resourceNames rule for list/watch).
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    subresources: tuple[str, ...] = ("status",)
    crd: str | None = None  # schema file under ../shared/schemas, for custom resources

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


def _core(plural: str, kind: str, namespaced: bool = True, *subs: str) -> Resource:
    return Resource("", "v1", plural, kind, namespaced, subs or ("status",))


RESOURCES = [
    _core("namespaces", "Namespace", False),
    _core("nodes", "Node", False),
    _core("pods", "Pod", True, "status", "eviction", "binding"),
    _core("services", "Service"),
    _core("configmaps", "ConfigMap"),
    _core("secrets", "Secret"),
    _core("serviceaccounts", "ServiceAccount"),
    _core("persistentvolumeclaims", "PersistentVolumeClaim"),
    Resource("apps", "v1", "deployments", "Deployment", True, ("status", "scale")),
    Resource("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", True),
    Resource("batch", "v1", "jobs", "Job", True),
    Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True),
    Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True),
    Resource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False),
    Resource("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    Resource("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    Resource(
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicies",
        "ValidatingAdmissionPolicy",
        False,
    ),
    Resource(
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicybindings",
        "ValidatingAdmissionPolicyBinding",
        False,
    ),
    Resource(
        "batch.volcano.sh",
        "v1alpha1",
        "jobs",
        "Job",
        True,
        crd="volcano/batch.volcano.sh_jobs.yaml",
    ),
    Resource(
        "scheduling.volcano.sh",
        "v1beta1",
        "queues",
        "Queue",
        False,
        crd="volcano/scheduling.volcano.sh_queues.yaml",
    ),
    Resource(
        "scheduling.volcano.sh",
        "v1beta1",
        "podgroups",
        "PodGroup",
        True,
        crd="volcano/scheduling.volcano.sh_podgroups.yaml",
    ),
    Resource(
        "jobset.x-k8s.io",
        "v1alpha2",
        "jobsets",
        "JobSet",
        True,
        crd="jobset/jobset.x-k8s.io_jobsets.yaml",
    ),
    *(
        Resource(
            "kueue.x-k8s.io",
            "v1beta2",
            plural,
            kind,
            namespaced,
            crd=f"kueue/kueue.x-k8s.io_{plural}.yaml",
        )
        for plural, kind, namespaced in (
            ("clusterqueues", "ClusterQueue", False),
            ("localqueues", "LocalQueue", True),
            ("resourceflavors", "ResourceFlavor", False),
            ("cohorts", "Cohort", False),
            ("workloadpriorityclasses", "WorkloadPriorityClass", False),
            ("workloads", "Workload", True),
        )
    ),
    Resource("argoproj.io", "v1alpha1", "workflowtaskresults", "WorkflowTaskResult", True),
]

BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCES}
BY_KIND = {(r.api_version, r.kind): r for r in RESOURCES}


def resource_for(obj: dict) -> Resource:
    try:
        return BY_KIND[(obj["apiVersion"], obj["kind"])]
    except KeyError:
        raise KeyError(
            f"the fake does not serve {obj.get('apiVersion')} {obj.get('kind')}"
        ) from None


@dataclass(frozen=True)
class RequestInfo:
    """What a request is about, as the authorizer and admission see it."""

    verb: str
    resource: Resource
    namespace: str = ""
    name: str = ""
    subresource: str = ""
    query: dict[str, str] = field(default_factory=dict)

    @property
    def rbac_resource(self) -> str:
        return (
            f"{self.resource.plural}/{self.subresource}"
            if self.subresource
            else (self.resource.plural)
        )


class NoRouteError(Exception):
    pass


def parse(method: str, raw_path: str) -> RequestInfo:
    """A request's attributes from its method and URL; NoRouteError when nothing serves it."""
    path, _, query_string = raw_path.partition("?")
    query = {k: v[-1] for k, v in urllib.parse.parse_qs(query_string).items()}
    parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise NoRouteError(path)
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest:
        raise NoRouteError(path)
    resource = BY_PATH.get((group, version, rest[0]))
    if resource is None or (namespace and not resource.namespaced):
        raise NoRouteError(path)
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if len(rest) > 3 or (subresource and subresource not in resource.subresources):
        raise NoRouteError(path)
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, "")
    if method == "GET":
        watching = query.get("watch", "").lower() in ("true", "1")
        verb = "get" if name else ("watch" if watching else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    if not verb:
        raise NoRouteError(path)
    if verb in ("list", "watch"):
        selector = query.get("fieldSelector", "")
        if selector.startswith("metadata.name=") and "," not in selector:
            name = selector.removeprefix("metadata.name=")
    return RequestInfo(verb, resource, namespace, name, subresource, query)
