"""The Kubernetes gang backend as the operators and triggers see it, from configuration.

``TIDEFLOW_BACKEND=kubernetes`` sends gang steps to the cluster; ``TIDEFLOW_K8S_*``
say where (see ``tideflow.kube.settings``). Credentials come from the Airflow
connection named by ``TIDEFLOW_K8S_CONN_ID`` (the cncf.kubernetes provider's
connection type: in-cluster, a kubeconfig path or inline kubeconfig), else from
the pod's ServiceAccount, else from ``$KUBECONFIG``.
"""

from __future__ import annotations

import os
from typing import Any

CONN_ENV = "TIDEFLOW_K8S_CONN_ID"


def api_client() -> Any:
    conn_id = os.environ.get(CONN_ENV)
    if conn_id:
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        return KubernetesHook(conn_id=conn_id).api_client
    from tideflow.kube.client import connect

    return connect()


def cluster_backend() -> Any:
    from tideflow.backends.kubernetes import KubernetesBackend
    from tideflow.kube.settings import kube_settings_from_env

    return KubernetesBackend(api_client(), kube_settings_from_env())
