"""Where gang steps go on Kubernetes, from ``TIDEFLOW_K8S_*`` variables.

Configuration, not pipeline YAML: the same pipeline runs on a laptop and on a
cluster. Unset variables keep ``KubeSettings``' defaults; a bad value is
refused with the variable's name and what is accepted.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

from tideflow import settings_registry as registry
from tideflow.compile.cluster_names import NAMESPACE
from tideflow.compile.gpu_products import GPU_PRODUCTS, gpu_products
from tideflow.config import ConfigError
from tideflow.settings_registry.declared_kubernetes import DEFAULT_IMAGE


@dataclass(frozen=True)
class KubeSettings:
    namespace: str = NAMESPACE
    image: str = DEFAULT_IMAGE
    store_secret: str = "tideflow-store"  # S3 credentials (or use IRSA: leave it empty)
    mlflow_tracking_uri: str = "http://mlflow.tideflow:5000"
    artifact_root: str = "s3://tideflow/artifacts"
    # Store roots besides artifact_root that teams' checkpoints may go under, as
    # TIDEFLOW_CHECKPOINT_ROOTS declares them (tideflow.storage.roots).
    checkpoint_roots: str = ""
    termination_grace_s: int = 300
    gang_scheduler: str = "volcano"  # or "kueue": a JobSet admitted by Kueue
    # A pipeline names a device model briefly ("H100"); nodes carry the full product
    # name GPU feature discovery gives them. A model not listed is used as written.
    model_labels: tuple[tuple[str, str], ...] = GPU_PRODUCTS
    master_port: int = 29500
    # ServiceAccounts (deploy/kubernetes/gangs.yaml, argo-rbac.yaml). Gang workers and
    # Argo's step containers never call the Kubernetes API and mount no token; Argo's
    # executor reports outputs with a token of its own.
    gang_service_account: str = "tideflow-gang"
    argo_service_account: str = "tideflow-argo-workflow"
    argo_executor_service_account: str = "tideflow-argo-executor"
    # An Argo gang step's driver (tideflow.gangs.driver) creates, follows and deletes
    # its gang object, with this account's token.
    argo_gang_driver_service_account: str = "tideflow-argo-gang-driver"
    priority_classes: tuple[tuple[int, str], ...] = (
        (1, "tideflow-training-high"),
        (0, "tideflow-training"),
        (-(10**9), "tideflow-spare"),
    )

    def priority_class(self, priority: int) -> str:
        return next(name for floor, name in self.priority_classes if priority >= floor)

    def model_label(self, model: str) -> str:
        """The node label value of a device model named in a pipeline."""
        return dict(self.model_labels).get(model, model)


SCHEDULERS = registry.declared("TIDEFLOW_K8S_GANG_SCHEDULER").choices
# A ServiceAccount's name: a DNS-1123 subdomain (lowercase alphanumerics, '-', '.').
SERVICE_ACCOUNT = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _service_account(env: Mapping[str, str] | None, variable: str) -> str:
    name = registry.text(variable, env, backend="kubernetes")
    if len(name) > 253 or not SERVICE_ACCOUNT.match(name):
        raise ConfigError(
            f"{variable}={name!r}: accepted: a ServiceAccount name (lowercase letters, "
            "digits, '-' and '.', at most 253 characters)"
        )
    return name


def kube_settings_from_env(environ: Mapping[str, str] | None = None) -> KubeSettings:
    """The settings of ``environ`` (``os.environ``): unset variables keep the
    registry's Kubernetes defaults (``KubeSettings``' own, a test keeps them equal)."""

    def value(name: str) -> str:
        return registry.text(name, environ, backend="kubernetes")

    return KubeSettings(
        namespace=value("TIDEFLOW_K8S_NAMESPACE"),
        image=value("TIDEFLOW_K8S_IMAGE"),
        # An empty value means no Secret: credentials come from the pod's identity (IRSA).
        store_secret=value("TIDEFLOW_K8S_STORE_SECRET"),
        mlflow_tracking_uri=value("TIDEFLOW_K8S_MLFLOW_URI")
        or (os.environ if environ is None else environ).get("MLFLOW_TRACKING_URI")
        or KubeSettings.mlflow_tracking_uri,
        artifact_root=value("TIDEFLOW_ARTIFACT_ROOT").rstrip("/"),
        checkpoint_roots=value("TIDEFLOW_CHECKPOINT_ROOTS"),
        termination_grace_s=registry.whole("TIDEFLOW_K8S_GRACE_S", environ, backend="kubernetes"),
        gang_scheduler=value("TIDEFLOW_K8S_GANG_SCHEDULER"),
        model_labels=gpu_products(environ),
        gang_service_account=_service_account(environ, "TIDEFLOW_K8S_GANG_SERVICE_ACCOUNT"),
        argo_service_account=_service_account(environ, "TIDEFLOW_K8S_ARGO_SERVICE_ACCOUNT"),
        argo_executor_service_account=_service_account(
            environ, "TIDEFLOW_K8S_ARGO_EXECUTOR_SERVICE_ACCOUNT"
        ),
        argo_gang_driver_service_account=_service_account(
            environ, "TIDEFLOW_K8S_ARGO_GANG_DRIVER_SERVICE_ACCOUNT"
        ),
    )


def settings_to_json(settings: KubeSettings) -> str:
    """The settings as one argument for a pod that acts on the cluster (the Argo gang driver)."""
    return json.dumps(asdict(settings), sort_keys=True, separators=(",", ":"))


def settings_from_json(text: str) -> KubeSettings:
    """The inverse of ``settings_to_json``; an unknown field is refused, not dropped."""
    data = json.loads(text)
    known = {f.name for f in fields(KubeSettings)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"--kube-settings has unknown fields: {', '.join(unknown)}")
    for key, value in data.items():  # JSON has no tuples; the settings' pairs are tuples
        if isinstance(value, list):
            data[key] = tuple(tuple(item) if isinstance(item, list) else item for item in value)
    return KubeSettings(**data)
