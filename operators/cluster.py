"""The Kubernetes gang backend as the operators and triggers see it, from configuration.

``TIDEFLOW_BACKEND=kubernetes`` sends gang steps to the cluster; ``TIDEFLOW_K8S_*``
say where (see ``tideflow.kube.settings``). Credentials come from the Airflow
connection named by ``TIDEFLOW_K8S_CONN_ID`` (the cncf.kubernetes provider's
connection type: in-cluster, a kubeconfig path or inline kubeconfig), else from
the pod's ServiceAccount, else from ``$KUBECONFIG``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

from tideflow import settings_registry as registry

CONN_ENV = "TIDEFLOW_K8S_CONN_ID"


def api_client() -> Any:
    conn_id = registry.optional_text(CONN_ENV)
    if conn_id:
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        return KubernetesHook(conn_id=conn_id).api_client
    from tideflow.kube.client import connect

    return connect()


def cluster_backend() -> Any:
    from tideflow.backends.kubernetes import KubernetesBackend
    from tideflow.kube.settings import kube_settings_from_env

    return KubernetesBackend(api_client(), kube_settings_from_env())


@contextlib.asynccontextmanager
async def async_api_client() -> AsyncIterator[Any]:
    """A ``kubernetes_asyncio`` client for triggers: watches without holding a thread."""
    conn_id = registry.optional_text(CONN_ENV)
    if conn_id:
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook

        async with AsyncKubernetesHook(conn_id=conn_id).get_conn() as api:
            yield api
        return
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        # The client reads $KUBECONFIG once, when it is imported; read it now instead.
        await config.load_kube_config(
            config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration
        )
    async with client.ApiClient(configuration) as api:
        yield api
