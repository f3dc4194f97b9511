"""Cluster inventory: detection on this machine and declared cluster files."""

from __future__ import annotations

import os
from pathlib import Path

from tideflow.inventory import detect_local, inventory_for


def test_this_machine_without_gpus_offers_its_cpu_cores() -> None:
    local = detect_local(gpu_names=[])
    (node,) = local.nodes
    assert node.device_class == "cpu" and node.devices == (os.cpu_count() or 1)
    assert not local.declared


def test_gpu_models_are_read_from_nvidia_smi_names() -> None:
    local = detect_local(gpu_names=["NVIDIA H100 80GB HBM3"] * 8)
    (node,) = local.nodes
    assert (node.device_class, node.model, node.devices) == ("gpu", "H100", 8)
    mixed = detect_local(gpu_names=["NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB"])
    assert mixed.nodes[0].model == "mixed"


def test_declared_cluster_expands_node_groups(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "apiVersion: tideflow/v1\nkind: Cluster\nmetadata: {name: lab}\nnodes:\n"
        "  - {name: a100, count: 4, cpu: 64, accelerators: {class: gpu, model: A100, count: 8},"
        " labels: {rack: r1}}\n"
        "  - {name: ascend, cpu: 192, accelerators: {class: npu, model: Ascend910, count: 8}}\n"
        "  - {name: cpu, count: 2, cpu: 32}\n"
    )
    inventory = inventory_for(str(path))
    assert [n.name for n in inventory.nodes] == [
        "a100-0",
        "a100-1",
        "a100-2",
        "a100-3",
        "ascend",
        "cpu-0",
        "cpu-1",
    ]
    assert inventory.total("gpu") == 32 and inventory.total("npu") == 8
    assert inventory.total("cpu") == 4 * 64 + 192 + 2 * 32
    assert inventory.nodes[0].labels == (("rack", "r1"),)
    assert inventory.max_gang_workers("gpu", "A100", 8) == 4
    assert inventory.max_gang_workers("npu", None, 4) == 2
