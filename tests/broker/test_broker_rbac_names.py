"""The names the broker's RBAC grants by are the names the broker's settings default to.

``deploy/kubernetes/broker-rbac.yaml`` narrows the broker's patches by
``resourceNames``; the broker reads the same names from ``TIDEFLOW_K8S_*``
(``tideflow.broker.kubernetes.target_from_env``). The deploy guide's table
says which must match; this keeps the defaults and the file in step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tideflow.broker.kubernetes import target_from_env

RBAC = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "broker-rbac.yaml"


def granted_names(resource: str) -> set[str]:
    names: set[str] = set()
    for document in yaml.safe_load_all(RBAC.read_text()):
        if document and document.get("kind") in ("Role", "ClusterRole"):
            for rule in document.get("rules", []):
                if resource in rule.get("resources", []):
                    names.update(rule.get("resourceNames", []))
    return names


def test_rbac_names_are_the_default_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("TIDEFLOW_K8S_INFERENCE_DEPLOYMENT", "TIDEFLOW_K8S_TRAINING_QUEUE"):
        monkeypatch.delenv(variable, raising=False)
    target = target_from_env()
    assert granted_names("deployments/scale") == {target.inference_deployment}
    assert granted_names("queues") == {target.training_queue}
    assert granted_names("clusterqueues") == {target.training_queue}
    # an HPA, when the broker is told to use one, is the deployment's namesake
    assert granted_names("horizontalpodautoscalers") == {target.inference_deployment}


def test_the_broker_role_lives_in_the_default_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIDEFLOW_K8S_NAMESPACE", raising=False)
    roles: list[dict[str, Any]] = [
        d for d in yaml.safe_load_all(RBAC.read_text()) if d and d.get("kind") == "Role"
    ]
    assert roles and {r["metadata"]["namespace"] for r in roles} == {target_from_env().namespace}


def test_the_deploy_guide_names_each_setting_that_must_match() -> None:
    guide = (RBAC.parent.parent.parent / "docs" / "how-to" / "deploy-kubernetes.md").read_text()
    for setting in (
        "TIDEFLOW_K8S_NAMESPACE",
        "TIDEFLOW_K8S_INFERENCE_DEPLOYMENT",
        "TIDEFLOW_K8S_INFERENCE_HPA",
        "TIDEFLOW_K8S_TRAINING_QUEUE",
    ):
        assert f"| `{setting}` |" in guide, setting
