"""RBAC authorization from the Roles, ClusterRoles and bindings in deploy/.

Reimplemented from the Kubernetes documentation "Using RBAC Authorization"
(the rules of k8s.io/kubernetes plugin/pkg/auth/authorizer/rbac):

* a ClusterRoleBinding grants its ClusterRole's rules everywhere; a RoleBinding
  grants its Role's (or a ClusterRole's) rules in the binding's namespace only;
* a subject matches a ServiceAccount by namespace and name (its user name is
  ``system:serviceaccount:<ns>:<name>``), a User by name, a Group by one of the
  caller's groups (a ServiceAccount is in ``system:serviceaccounts``,
  ``system:serviceaccounts:<ns>`` and ``system:authenticated``);
* a rule allows a request when its apiGroups, resources (``<resource>`` or
  ``<resource>/<subresource>``, ``*`` and ``*/<subresource>`` as wildcards) and
  verbs match, and its resourceNames, when set, hold the request's name (a
  request without a name, such as create or an unfiltered list, never matches a
  rule with resourceNames).

Anything not allowed is refused with 403 Forbidden and the API server's message.
``unused`` lists the grants no allowed request has used, so a test can show that
deploy/ grants nothing tideflow never calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.kubefake.resources import RequestInfo
from tests.kubefake.status import ApiError

ADMIN = "kubernetes-admin"  # in system:masters: every request is allowed


@dataclass(frozen=True, order=True)
class Grant:
    """One (group, resource, verb, name) a role grants; name "" for every name."""

    role: str  # Kind/namespace/name of the role it comes from
    group: str
    resource: str
    verb: str
    name: str = ""


def service_account(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def groups_of(user: str) -> set[str]:
    found = {"system:authenticated"}
    if user == ADMIN:
        found.add("system:masters")
    if user.startswith("system:serviceaccount:"):
        namespace = user.split(":")[2]
        found |= {"system:serviceaccounts", f"system:serviceaccounts:{namespace}"}
    return found


def _subject_matches(subject: dict[str, Any], user: str, binding_ns: str) -> bool:
    kind = subject.get("kind")
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_ns
        return user == service_account(namespace, subject["name"])
    if kind == "User":
        return user == subject["name"]
    if kind == "Group":
        return subject["name"] in groups_of(user)
    return False


def _matches(pattern: list[str], value: str) -> bool:
    return "*" in pattern or value in pattern


def _resource_matches(resources: list[str], info: RequestInfo) -> bool:
    wanted = info.rbac_resource
    if "*" in resources or wanted in resources:
        return True
    return bool(info.subresource) and f"*/{info.subresource}" in resources


class Authorizer:
    def __init__(self, documents: list[dict[str, Any]]) -> None:
        self.roles: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        self.bindings: list[dict[str, Any]] = []
        for doc in documents:
            kind, meta = doc.get("kind"), doc.get("metadata") or {}
            if kind in ("Role", "ClusterRole"):
                namespace = meta.get("namespace", "") if kind == "Role" else ""
                self.roles[(kind, namespace, meta["name"])] = doc.get("rules") or []
            elif kind in ("RoleBinding", "ClusterRoleBinding"):
                self.bindings.append(doc)
        self.used: set[Grant] = set()

    @classmethod
    def from_paths(cls, paths: list[Path]) -> Authorizer:
        documents = []
        for path in paths:
            documents += [d for d in yaml.safe_load_all(path.read_text()) if d]
        return cls(documents)

    def _applicable(self, user: str, namespace: str) -> list[tuple[str, list[dict[str, Any]]]]:
        """(role id, rules) of every binding that applies to ``user`` for ``namespace``."""
        found = []
        for binding in self.bindings:
            meta = binding.get("metadata") or {}
            binding_ns = meta.get("namespace", "")
            if binding["kind"] == "RoleBinding" and binding_ns != namespace:
                continue
            if not any(_subject_matches(s, user, binding_ns) for s in binding.get("subjects", [])):
                continue
            ref = binding["roleRef"]
            role_ns = binding_ns if ref["kind"] == "Role" else ""
            rules = self.roles.get((ref["kind"], role_ns, ref["name"]))
            if rules is not None:
                found.append((f"{ref['kind']}/{role_ns}/{ref['name']}".replace("//", "/"), rules))
        return found

    def allowed(self, user: str, info: RequestInfo) -> Grant | None:
        """The grant that allows the request, or None."""
        namespace = info.namespace if info.resource.namespaced else ""
        for role, rules in self._applicable(user, namespace):
            for rule in rules:
                if not _matches(rule.get("apiGroups", []), info.resource.group):
                    continue
                if not _resource_matches(rule.get("resources", []), info):
                    continue
                if not _matches(rule.get("verbs", []), info.verb):
                    continue
                names = rule.get("resourceNames") or []
                if names and info.name not in names:
                    continue
                return Grant(
                    role,
                    info.resource.group,
                    info.rbac_resource,
                    info.verb,
                    info.name if names else "",
                )
        return None

    def authorize(self, user: str, info: RequestInfo) -> None:
        if user == ADMIN:
            return
        grant = self.allowed(user, info)
        if grant is None:
            raise forbidden(user, info)
        self.used.add(grant)

    def grants(self, user: str, namespace: str = "") -> set[Grant]:
        """Every (role, group, resource, verb, name) ``user`` holds in ``namespace``."""
        found = set()
        for scope in {"", namespace}:
            for role, rules in self._applicable(user, scope):
                for rule in rules:
                    for group in rule.get("apiGroups", []):
                        for resource in rule.get("resources", []):
                            for verb in rule.get("verbs", []):
                                for name in rule.get("resourceNames") or [""]:
                                    found.add(Grant(role, group, resource, verb, name))
        return found

    def unused(self, user: str, namespace: str = "") -> set[Grant]:
        """The grants ``user`` holds that no allowed request has used."""
        return self.grants(user, namespace) - self.used


def forbidden(user: str, info: RequestInfo) -> ApiError:
    """403 with the API server's wording (k8s.io/apiserver pkg/endpoints/handlers/responsewriters
    ForbiddenStatusError)."""
    resource, group = info.rbac_resource, info.resource.group
    what = f"{info.resource.plural}{'.' + group if group else ''}"
    subject = f'{what} "{info.name}"' if info.name and info.verb not in ("list", "watch") else what
    scope = (
        f'in the namespace "{info.namespace}"'
        if info.resource.namespaced and info.namespace
        else "at the cluster scope"
    )
    return ApiError(
        403,
        f'{subject} is forbidden: User "{user}" cannot {info.verb} resource "{resource}" '
        f'in API group "{group}" {scope}',
        details={"name": info.name, "group": group, "kind": info.resource.plural},
    )
