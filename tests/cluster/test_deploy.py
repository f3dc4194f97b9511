"""deploy/kubernetes on a real API server: admitted by server-side apply, RBAC that
lets each component do its job and nothing more, the broker's node policy in force.

The API server, its RBAC authorizer and its ValidatingAdmissionPolicy (CEL)
evaluator are upstream's; the broker's ServiceAccount is impersonated by the
admin, as ``kubectl --as`` does.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.cluster.conftest import service_account
from tests.kube.test_deploy_manifests import BROKER, REASONS, REFUSED, _set
from tests.kube.test_deploy_manifests import gpu_node as sample_node
from tideflow.stack.cluster.kubeapi import Kube
from tideflow.stack.cluster.state import ClusterState

NAMESPACE = "tideflow"


def test_every_manifest_is_admitted_by_server_side_apply_with_strict_validation(
    deployed: list[tuple[str, dict[str, Any]]], kube: Kube
) -> None:
    for source, obj in deployed:
        resource = kube.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        meta = obj["metadata"]
        found = resource.get(name=meta["name"], namespace=meta.get("namespace"))
        assert found.metadata.uid, (source, obj["kind"], meta["name"])


def test_strict_validation_refuses_a_manifest_with_an_unknown_field(kube: Kube) -> None:
    """The check above can fail: a misspelt field is refused, not dropped."""
    broken = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "misspelt", "namespace": "default"},
        "automountServiceAcountToken": False,
    }
    with pytest.raises(ApiException) as refused:
        kube.apply([broken])
    # kube-apiserver answers a server-side apply it cannot type with 500, not 400
    assert ".automountServiceAcountToken: field not declared in schema" in refused.value.body


def gpu_node(kube: Kube, name: str) -> None:
    """The offline policy test's GPU node of the training pool, created for real."""
    node = sample_node()
    node["metadata"]["name"] = node["metadata"]["labels"]["kubernetes.io/hostname"] = name
    node["status"] = {"capacity": {"nvidia.com/gpu": "8", "cpu": "64", "pods": "110"}}
    kube.create_nodes([node])


def test_the_broker_moves_a_gpu_node_between_pools_through_the_real_policy(
    deployed: list[tuple[str, dict[str, Any]]], kube: Kube, cluster: ClusterState
) -> None:
    from tideflow.broker.kubernetes import KubernetesActuator, target_from_env

    gpu_node(kube, "policy-move")
    broker = KubernetesActuator(service_account(cluster, "tideflow-broker"), target_from_env())
    core = client.CoreV1Api(kube.api)
    broker._set_pool(core.read_node("policy-move"), "inference")
    node = core.read_node("policy-move")
    assert node.metadata.labels["tideflow.io/pool"] == "inference"
    pool_taints = [t for t in node.spec.taints if t.key == "tideflow.io/pool"]
    assert [(t.value, t.effect) for t in pool_taints] == [("inference", "NoSchedule")]
    assert any(t.key == "nvidia.com/gpu" for t in node.spec.taints)


def test_the_broker_keeps_a_taint_added_between_its_read_and_its_patch(
    deployed: list[tuple[str, dict[str, Any]]],
    kube: Kube,
    cluster: ClusterState,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GPU health check taints the node just after the broker read it: the broker's
    patch, which sends the taint list whole, must neither drop that taint nor be
    refused by the node policy for changing it; it is a conflict, read again."""
    from tideflow.broker.kubernetes import KubernetesActuator, target_from_env

    gpu_node(kube, "policy-race")
    admin = client.CoreV1Api(kube.api)
    broker = KubernetesActuator(service_account(cluster, "tideflow-broker"), target_from_env())
    read_node = broker.pools.core.read_node
    health = {"key": "example.com/gpu-health", "value": "failing", "effect": "NoSchedule"}

    def read_then_taint(name: str, **kwargs: Any) -> Any:
        node = read_node(name, **kwargs)
        if not any(t["key"] == health["key"] for t in _taints(admin, name)):
            admin.patch_node(name, [{"op": "add", "path": "/spec/taints/-", "value": health}])
        return node

    monkeypatch.setattr(broker.pools.core, "read_node", read_then_taint)
    broker._set_pool(admin.read_node("policy-race"), "inference")
    node = admin.read_node("policy-race")
    assert node.metadata.labels["tideflow.io/pool"] == "inference"
    assert health in _taints(admin, "policy-race")
    assert {"key": "tideflow.io/pool", "value": "inference", "effect": "NoSchedule"} in _taints(
        admin, "policy-race"
    )


def _taints(core: client.CoreV1Api, name: str) -> list[dict[str, Any]]:
    node = client.ApiClient().sanitize_for_serialization(core.read_node(name))
    return list(node["spec"].get("taints", []))


def _patch(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """A JSON patch from ``before`` to ``after``, field by field (the broker may patch
    nodes, not update them)."""
    ops = []
    for parent, key in [
        ("metadata", k) for k in ("labels", "annotations", "finalizers", "ownerReferences")
    ] + [("", "spec")]:
        old = before.get(parent, {}) if parent else before
        new = after.get(parent, {}) if parent else after
        path = f"/{parent}/{key}" if parent else f"/{key}"
        if key in new and new[key] != old.get(key):
            ops.append({"op": "add", "path": path, "value": new[key]})
        elif key in old and key not in new:
            ops.append({"op": "remove", "path": path})
    return ops


def _refused_patch(api: client.ApiClient, name: str, change: Callable[[dict], None]) -> str:
    """The refusal of ``change`` to node ``name`` as ``api``'s user ("" if admitted).

    The patch holds the resourceVersion it was read at: the node lifecycle controller
    taints a new node meanwhile, and a patch sending the old taints back would be
    refused for changing that taint, not for ``change``."""
    core = client.CoreV1Api(api)
    for _ in range(5):
        current = client.ApiClient().sanitize_for_serialization(core.read_node(name))
        wanted = copy.deepcopy(current)
        change(wanted)
        version = current["metadata"]["resourceVersion"]
        precondition = {"op": "replace", "path": "/metadata/resourceVersion", "value": version}
        try:
            core.patch_node(name, [precondition, *_patch(current, wanted)])
        except ApiException as exc:
            if exc.status == 409:
                continue
            assert exc.status in (403, 422), exc.body
            return str(exc.body)
        return ""
    raise AssertionError(f"node {name} kept changing")


# Changes the API server's own validation refuses, for everyone, before any admission
# policy runs (offline, only the policy is evaluated).
CORE_REFUSALS = {
    "providerID changed": "may not change providerID",
    "podCIDR changed": "may not change podCIDR",
}
# A finalizer the API server accepts: "x" is refused by its validation first.
CHANGES = {**REFUSED, "a finalizer added": _set("metadata", "finalizers", to=["example.com/x"])}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_real_policy_refuses_every_other_node_change_by_the_broker(
    case: str, deployed: list[tuple[str, dict[str, Any]]], kube: Kube, cluster: ClusterState
) -> None:
    name = "policy-" + "".join(c if c.isalnum() else "-" for c in case.lower())[:40].strip("-")
    gpu_node(kube, name)
    broker = service_account(cluster, "tideflow-broker")
    refused = _refused_patch(broker, name, CHANGES[case])
    (reason,) = [r for word, r in REASONS.items() if word in case]
    assert CORE_REFUSALS.get(case, reason) in refused, (case, refused)
    # The same change by someone else is not the policy's business.
    admin_refusal = _refused_patch(kube.api, name, CHANGES[case])
    assert "ValidatingAdmissionPolicy" not in admin_refusal, admin_refusal


def test_broker_is_the_user_the_policy_names() -> None:
    assert f"system:serviceaccount:{NAMESPACE}:tideflow-broker" == BROKER
