"""The few API calls that bringing the cluster up needs, through the official Python client."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tideflow.stack.processes import StackError

FIELD_MANAGER = "tideflow-cluster"


class Kube:
    def __init__(self, kubeconfig: Path) -> None:
        from kubernetes import config, dynamic

        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.dynamic = dynamic.DynamicClient(self.api)

    def apply(self, objects: Iterable[dict[str, Any]], manager: str = FIELD_MANAGER) -> list[Any]:
        """Server-side apply with strict field validation (an unknown or duplicated
        field is an error, not a warning), forcing conflicts: ``manager`` owns what it
        declares. Returns the objects as the server stored them."""
        stored = []
        for obj in objects:
            resource = self.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            meta = obj["metadata"]
            stored.append(
                self.dynamic.server_side_apply(
                    resource,
                    body=obj,
                    name=meta["name"],
                    namespace=meta.get("namespace"),
                    field_manager=manager,
                    force_conflicts=True,
                    query_params=[("fieldValidation", "Strict")],
                )
            )
        return stored

    def wait_crds_established(self, timeout_s: float = 60.0) -> None:
        from kubernetes import client

        extensions = client.ApiextensionsV1Api(self.api)
        deadline = time.monotonic() + timeout_s
        while True:
            pending = [
                crd.metadata.name
                for crd in extensions.list_custom_resource_definition().items
                if not any(
                    c.type == "Established" and c.status == "True"
                    for c in (crd.status.conditions or [])
                )
            ]
            if not pending:
                break
            if time.monotonic() > deadline:
                raise StackError(f"CRDs not established within {timeout_s:.0f}s: {pending}")
            time.sleep(0.5)
        self.dynamic.resources.invalidate_cache()

    def ensure_namespace(self, name: str) -> None:
        self.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}])

    def create_nodes(self, nodes: Iterable[dict[str, Any]]) -> None:
        """Create Nodes with their status (a Node's create keeps the status it is given)."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        core = client.CoreV1Api(self.api)
        for node in nodes:
            try:
                core.create_node(node)
            except ApiException as exc:
                if exc.status != 409:
                    raise
