"""An API client for the official ``kubernetes`` package: in-cluster, else kubeconfig."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

# The client would send a dict body as a JSON *Patch* (its first content type), which
# the API server rejects; tideflow's patches are JSON merge patches.
MERGE = "application/merge-patch+json"
CONFLICT_TRIES = 5  # reads of an object that keeps changing before its conflict is raised

T = TypeVar("T")


def on_conflict_read_again(write: Callable[[], T], tries: int = CONFLICT_TRIES) -> T:
    """Run ``write`` (a read, then a patch carrying the resourceVersion it read) again
    while the API server answers 409 Conflict: the object changed between the two, and
    a list sent back whole would otherwise lose that change. The last conflict raises."""
    from kubernetes.client.rest import ApiException

    for _ in range(tries - 1):
        try:
            return write()
        except ApiException as exc:
            if exc.status != 409:
                raise
    return write()


def connect(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """In-cluster credentials (a pod's ServiceAccount) when there are any, else kubeconfig.

    Each call builds its own ``Configuration`` instead of loading into the
    package-wide default, so two clients in one process (an Airflow worker
    running tasks for two clusters) do not overwrite each other.
    """
    from kubernetes import client, config

    if kubeconfig is None and context is None:
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        except config.ConfigException:
            pass
    # The client reads $KUBECONFIG once, when it is imported; read it now instead.
    path = kubeconfig or os.environ.get("KUBECONFIG")
    try:
        return config.new_client_from_config(config_file=path, context=context)
    except (config.ConfigException, OSError) as exc:  # no cluster to reach: a setting
        from tideflow.config import bad_setting

        raise bad_setting(
            "KUBECONFIG",
            path,
            "a kubeconfig file naming the cluster (default ~/.kube/config), or a pod's "
            "ServiceAccount",
            str(exc).strip().rstrip(".") or type(exc).__name__,
        ) from None
