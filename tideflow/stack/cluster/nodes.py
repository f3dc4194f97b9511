"""A cluster file's nodes as kwok nodes: Node objects whose status kwok keeps, with no kubelet.

Each node carries what the compiled queues select on (the group's labels, or
the device model's label when it declares none) and its devices as extended
resources (``nvidia.com/gpu``), so the real scheduler places gangs by them.
"""

from __future__ import annotations

from typing import Any

from tideflow.compile.cluster_names import DEVICE_RESOURCES, MODEL_LABELS, POOL_LABEL
from tideflow.inventory import ClusterSpec, NodeGroup
from tideflow.kube.settings import KubeSettings

# kwok manages the nodes that carry this label (its --manage-nodes-with-label-selector).
KWOK_LABEL = ("type", "kwok")
# The pool a node is in when its group declares none, as docs/deploy-kubernetes.md
# (step 5) has a platform team label its nodes: gang pods select their pool.
DEFAULT_POOLS = {"gpu": "training", "npu": "npu", None: "cpu"}


def node_names(group: NodeGroup) -> list[str]:
    if group.count == 1:
        return [group.name]
    return [f"{group.name}-{index}" for index in range(group.count)]


def node_object(name: str, group: NodeGroup) -> dict[str, Any]:
    labels = {
        KWOK_LABEL[0]: KWOK_LABEL[1],
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        **group.labels,
    }
    capacity: dict[str, str] = {"cpu": str(group.cpu), "pods": "110"}
    capacity["memory"] = str(group.memory) if str(group.memory) != "0" else "64Gi"
    accelerators = group.accelerators
    device_class = accelerators.device_class if accelerators is not None else None
    labels.setdefault(POOL_LABEL, DEFAULT_POOLS[device_class])
    if accelerators is not None:
        capacity[DEVICE_RESOURCES[accelerators.device_class]] = str(accelerators.count)
        # the product name GPU feature discovery puts on a real node of this model
        product = KubeSettings().model_label(accelerators.model)
        labels.setdefault(MODEL_LABELS[accelerators.device_class], product)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "spec": {},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def cluster_nodes(spec: ClusterSpec) -> list[dict[str, Any]]:
    return [node_object(name, group) for group in spec.nodes for name in node_names(group)]
