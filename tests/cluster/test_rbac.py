"""deploy/'s RBAC as the real authorizer reads it: each ServiceAccount may do what its
component calls, and is refused what it must not do.

What each component calls comes from the code (``GANG_KINDS``, the broker's
target) and the offline test's lists (tests/kube/test_deploy_manifests.py); the
API server answers each question with a SubjectAccessReview, as ``kubectl auth
can-i --as`` asks it.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from tests.cluster.conftest import NAMESPACE
from tideflow.stack.cluster.kubeapi import Kube

Ask = tuple[str, str, str, str | None, str | None]  # verb, group, resource, namespace, name


def may(kube: Kube, account: str, ask: Ask) -> bool:
    verb, group, resource, namespace, name = ask
    resource, _, subresource = resource.partition("/")
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=f"system:serviceaccount:{NAMESPACE}:{account}",
            groups=["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"],
            resource_attributes=client.V1ResourceAttributes(
                verb=verb,
                group=group,
                resource=resource,
                subresource=subresource or None,
                namespace=namespace,
                name=name,
            ),
        )
    )
    answer = client.AuthorizationV1Api(kube.api).create_subject_access_review(review)
    return bool(answer.status.allowed)


def gang_object_asks(verbs: tuple[str, ...]) -> list[Ask]:
    from tideflow.backends.kubernetes import GANG_KINDS

    return [
        (verb, kind.group, kind.plural, NAMESPACE, None)
        for kind in GANG_KINDS.values()
        for verb in verbs
    ]


def broker_asks() -> list[Ask]:
    from tideflow.broker.kubernetes import target_from_env

    queue = target_from_env().training_queue
    return [
        ("list", "", "pods", NAMESPACE, None),
        ("create", "", "pods/eviction", NAMESPACE, None),
        ("patch", "apps", "deployments/scale", NAMESPACE, "inference"),
        ("patch", "autoscaling", "horizontalpodautoscalers", NAMESPACE, "inference"),
        ("list", "", "nodes", None, None),
        ("patch", "", "nodes", None, "gpu-1"),
        ("get", "kueue.x-k8s.io", "clusterqueues", None, queue),
        ("patch", "kueue.x-k8s.io", "clusterqueues", None, queue),
        ("list", "kueue.x-k8s.io", "workloads", NAMESPACE, None),
    ]


NEEDED: dict[str, Any] = {
    "tideflow-airflow-worker": lambda: gang_object_asks(("get", "create", "delete")),
    "tideflow-airflow-triggerer": lambda: gang_object_asks(("list", "watch", "delete")),
    "tideflow-broker": broker_asks,
}

REFUSED: dict[str, list[Ask]] = {
    "tideflow-airflow-worker": [
        ("get", "", "secrets", NAMESPACE, None),
        ("create", "", "pods", NAMESPACE, None),
        ("patch", "jobset.x-k8s.io", "jobsets", NAMESPACE, None),
        ("create", "jobset.x-k8s.io", "jobsets", "default", None),
    ],
    "tideflow-airflow-triggerer": [
        ("create", "jobset.x-k8s.io", "jobsets", NAMESPACE, None),
        ("get", "", "secrets", NAMESPACE, None),
    ],
    "tideflow-broker": [
        ("get", "", "secrets", NAMESPACE, None),
        ("delete", "", "pods", NAMESPACE, None),
        ("delete", "", "nodes", None, "gpu-1"),
        ("patch", "", "nodes/status", None, "gpu-1"),
        ("patch", "kueue.x-k8s.io", "clusterqueues", None, "vision"),
        ("patch", "apps", "deployments/scale", NAMESPACE, "mlflow"),
        ("create", "", "pods/eviction", "kube-system", None),
    ],
    "tideflow-gang": [
        ("get", "", "pods", NAMESPACE, None),
        ("list", "jobset.x-k8s.io", "jobsets", NAMESPACE, None),
    ],
}


@pytest.mark.parametrize("account", sorted(NEEDED))
def test_each_service_account_may_do_what_its_component_calls(
    account: str, deployed: Any, kube: Kube
) -> None:
    denied = [ask for ask in NEEDED[account]() if not may(kube, account, ask)]
    assert not denied, denied


@pytest.mark.parametrize("account", sorted(REFUSED))
def test_each_service_account_is_refused_what_it_must_not_do(
    account: str, deployed: Any, kube: Kube
) -> None:
    allowed = [ask for ask in REFUSED[account] if may(kube, account, ask)]
    assert not allowed, allowed
