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
from dataclasses import asdict, fields

from tideflow.compile.gpu_products import gpu_products
from tideflow.config import ConfigError
from tideflow.kube.volcano import KubeSettings

SCHEDULERS = ("volcano", "kueue")
# A ServiceAccount's name: a DNS-1123 subdomain (lowercase alphanumerics, '-', '.').
SERVICE_ACCOUNT = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _service_account(env: Mapping[str, str], variable: str, default: str) -> str:
    name = env.get(variable, default)
    if len(name) > 253 or not SERVICE_ACCOUNT.match(name):
        raise ConfigError(
            f"{variable}={name!r}: accepted: a ServiceAccount name (lowercase letters, "
            "digits, '-' and '.', at most 253 characters)"
        )
    return name


def kube_settings_from_env(environ: Mapping[str, str] | None = None) -> KubeSettings:
    env = os.environ if environ is None else environ
    defaults = KubeSettings()
    scheduler = env.get("TIDEFLOW_K8S_GANG_SCHEDULER", defaults.gang_scheduler)
    if scheduler not in SCHEDULERS:
        raise ConfigError(
            f"TIDEFLOW_K8S_GANG_SCHEDULER={scheduler!r}: accepted: {', '.join(SCHEDULERS)}"
        )
    grace = env.get("TIDEFLOW_K8S_GRACE_S", str(defaults.termination_grace_s))
    if not grace.isdigit() or int(grace) < 30:
        raise ConfigError(
            f"TIDEFLOW_K8S_GRACE_S={grace!r}: accepted: whole seconds >= 30 "
            "(the time a worker has to write a checkpoint after SIGTERM)"
        )
    models = gpu_products(env)
    return KubeSettings(
        namespace=env.get("TIDEFLOW_K8S_NAMESPACE", defaults.namespace),
        image=env.get("TIDEFLOW_K8S_IMAGE", defaults.image),
        # An empty value means no Secret: credentials come from the pod's identity (IRSA).
        store_secret=env.get("TIDEFLOW_K8S_STORE_SECRET", defaults.store_secret),
        mlflow_tracking_uri=env.get("TIDEFLOW_K8S_MLFLOW_URI")
        or env.get("MLFLOW_TRACKING_URI")
        or defaults.mlflow_tracking_uri,
        artifact_root=env.get("TIDEFLOW_ARTIFACT_ROOT", defaults.artifact_root).rstrip("/"),
        checkpoint_roots=env.get("TIDEFLOW_CHECKPOINT_ROOTS", defaults.checkpoint_roots),
        termination_grace_s=int(grace),
        gang_scheduler=scheduler,
        model_labels=models,
        gang_service_account=_service_account(
            env, "TIDEFLOW_K8S_GANG_SERVICE_ACCOUNT", defaults.gang_service_account
        ),
        argo_service_account=_service_account(
            env, "TIDEFLOW_K8S_ARGO_SERVICE_ACCOUNT", defaults.argo_service_account
        ),
        argo_executor_service_account=_service_account(
            env,
            "TIDEFLOW_K8S_ARGO_EXECUTOR_SERVICE_ACCOUNT",
            defaults.argo_executor_service_account,
        ),
        argo_gang_driver_service_account=_service_account(
            env,
            "TIDEFLOW_K8S_ARGO_GANG_DRIVER_SERVICE_ACCOUNT",
            defaults.argo_gang_driver_service_account,
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
