"""How many GPUs a node the broker moves holds.

The broker lends and takes back whole nodes. Locally the cluster file (or this
machine) says what each node holds, so that is the size: a second number in
``TIDEFLOW_BROKER_NODE_GPUS`` could only disagree with it. Only when the nodes of
the class differ in size must the variable pick the size the broker moves (the
nodes of other sizes are then counted in GPUs, never taken whole). On a cluster
the variable, when set, is the size; unset, the nodes' allocatable GPUs give it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tideflow.config import bad_setting

if TYPE_CHECKING:
    from tideflow.inventory import Inventory

NODE_GPUS_ENV = "TIDEFLOW_BROKER_NODE_GPUS"


def _names(names: list[str]) -> str:
    """A few node names, the rest counted: the message stays one line on a big cluster."""
    if len(names) <= 3:
        return ", ".join(names)
    return f"{names[0]}, {names[1]}, ... {names[-1]} ({len(names)} nodes)"


def describe_sizes(sizes: Mapping[str, int], device_class: str) -> str:
    """``1 gpu on n-0, n-1, ... n-7 (8 nodes); 8 gpu on big-0, big-1``."""
    by_size: dict[int, list[str]] = defaultdict(list)
    for name, gpus in sizes.items():
        by_size[gpus].append(name)
    return "; ".join(f"{n} {device_class} on {_names(by_size[n])}" for n in sorted(by_size))


def node_gpus(
    sizes: Mapping[str, int], configured: int | None, device_class: str, where: str
) -> int:
    """The node size the broker moves, from ``sizes`` (node name -> its devices of the
    class, at least one node, those without any left out) read from ``where``;
    ``configured`` is ``TIDEFLOW_BROKER_NODE_GPUS`` (None: unset), which must be one
    of those sizes.

    ``ConfigError`` when the nodes differ in size and the variable names none of
    them: the message says which nodes hold what."""
    held = sorted(set(sizes.values()))
    if configured is None and len(held) == 1:
        return held[0]
    if configured is not None and configured in held:
        return configured
    why = f"the nodes of {where} hold {describe_sizes(sizes, device_class)}"
    if configured is None:
        why += ", so the size of the nodes the broker moves must be named"
    value = None if configured is None else str(configured)
    raise bad_setting(NODE_GPUS_ENV, value, ", ".join(map(str, held)), why)


def local_node_gpus(inventory: Inventory, cluster_file: str | None, settings: Any) -> int:
    """The local broker's node size: the nodes the cluster file declares (or this
    machine, without one) holding devices of the broker's class."""
    sizes = {
        n.name: n.devices
        for n in inventory.nodes
        if n.device_class == settings.device_class and n.devices > 0
    }
    where = f"the cluster file {cluster_file}" if cluster_file else "this machine"
    if not sizes:
        raise bad_setting(
            "TIDEFLOW_CLUSTER_FILE",
            cluster_file,
            f"a cluster file with {settings.device_class} nodes, or "
            "TIDEFLOW_BROKER_DEVICE_CLASS naming a class its nodes have",
            f"{where} has no {settings.device_class} devices for the broker to move",
        )
    return node_gpus(sizes, settings.node_gpus, settings.device_class, where)
