"""The ``cluster`` tier: tests against a real Kubernetes control plane.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler of one
Kubernetes release, the Kueue and JobSet controllers with their webhooks, and
kwok nodes, built from their Go modules and started on 127.0.0.1 by
``tideflow.stack.cluster`` (the same code as ``make cluster``), once for this
package of tests, and stopped when they are done. kwok stands in for the kubelet and the
container runtime, which cannot run here: pods are scheduled and bound by the
real scheduler, and kwok's stages move them through their phases.

Without Go (and no binaries cached) the tier is skipped, unless
``TIDEFLOW_REQUIRE_CLUSTER=1`` (CI sets it), which makes that a failure.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tideflow.stack.cluster import lifecycle
from tideflow.stack.cluster.build import COMPONENTS, binary_dir, versions
from tideflow.stack.cluster.kubeapi import Kube
from tideflow.stack.cluster.state import ClusterState

HERE = Path(__file__).parent
DEPLOY = HERE.parents[1] / "deploy" / "kubernetes"
NAMESPACE = "tideflow"
# Volcano's controllers are not part of this cluster (docs/how-to/deploy-kubernetes.md says
# why), so neither are its CRDs: its queues cannot be applied here.
WITHOUT_CRDS = {"volcano-queues.yaml"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)


def _buildable() -> bool:
    pinned = versions()
    cached = all((binary_dir(c, pinned[c.name]) / ".complete").exists() for c in COMPONENTS)
    return cached or shutil.which("go") is not None


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterState]:
    if not _buildable():
        reason = "Go is not installed and no cluster binaries are cached (make cluster)"
        if os.environ.get("TIDEFLOW_REQUIRE_CLUSTER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    home = tmp_path_factory.mktemp("cluster")
    state = lifecycle.up(home, say=lambda line: print(line, flush=True))
    try:
        yield state
    finally:
        lifecycle.down(home)


@pytest.fixture(scope="package")
def kube(cluster: ClusterState) -> Kube:
    return Kube(cluster.admin)


def manifests() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        if path.name in WITHOUT_CRDS:
            continue
        found += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    # Namespaces first: everything namespaced needs its namespace.
    return sorted(found, key=lambda item: item[1]["kind"] != "Namespace")


def as_user(state: ClusterState, user: str, groups: tuple[str, ...] = ()) -> client.ApiClient:
    """A client that the admin makes act as ``user`` (impersonation, as ``kubectl --as``)."""
    api = Kube(state.admin).api
    api.set_default_header("Impersonate-User", user)
    for group in groups:  # the client sends one header; the API server reads one group
        api.set_default_header("Impersonate-Group", group)
    return api


def service_account(state: ClusterState, name: str) -> client.ApiClient:
    return as_user(state, f"system:serviceaccount:{NAMESPACE}:{name}", ("system:serviceaccounts",))


@pytest.fixture(scope="package")
def deployed(kube: Kube) -> list[tuple[str, dict[str, Any]]]:
    """Every manifest of deploy/kubernetes, applied as a platform team would."""
    applied = manifests()
    stored = kube.apply([obj for _, obj in applied], manager="tideflow-deploy")
    assert len(stored) == len(applied)
    return applied


@pytest.fixture(scope="package")
def lab_queues(deployed: Any, kube: Kube) -> None:
    """The lab cluster file's teams compiled for Kueue and applied (its nodes are kwok's)."""
    from tideflow.compile.kueue_queues import kueue_objects
    from tideflow.inventory import ClusterSpec
    from tideflow.spec.loader import load_model
    from tideflow.stack.cluster.lifecycle import DEFAULT_NODES

    objects, _ = kueue_objects(load_model(DEFAULT_NODES, ClusterSpec))
    kube.apply(objects, manager="tideflow-compile")


def service_account_kubeconfig(state: ClusterState, name: str, path: Path) -> Path:
    """A kubeconfig holding a token of ServiceAccount ``name`` (the TokenRequest API, as
    a pod's projected token): the identity itself, not the admin impersonating it.
    The ServiceAccount is created if missing (Airflow's chart makes the Airflow ones;
    deploy/kubernetes only binds Roles to them)."""
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": NAMESPACE},
    }
    Kube(state.admin).apply([account], manager="tideflow-test")
    request = {"spec": {"expirationSeconds": 3600}}
    token = (
        client.CoreV1Api(Kube(state.admin).api)
        .create_namespaced_service_account_token(name, NAMESPACE, request)
        .status.token
    )
    config = yaml.safe_load(state.admin.read_text())
    config["users"] = [{"name": name, "user": {"token": token}}]
    for context in config["contexts"]:
        context["context"]["user"] = name
    path.write_text(yaml.safe_dump(config))
    return path
