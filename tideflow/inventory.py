"""Cluster inventory: which nodes exist and which devices each one holds.

An inventory is either declared in a cluster file (``kind: Cluster``, read by
``load_cluster`` through the spec package's loader) or detected on this
machine. Declaring devices the machine does not have is how scheduling
scenarios run on a laptop: those devices are emulated on the CPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from pydantic import Field, model_validator

from tideflow.config import bad_setting
from tideflow.spec.base import SpecModel
from tideflow.spec.errors import SpecError, SpecIssue
from tideflow.spec.fields import MemoryQuantity, Name, fail, strict_int
from tideflow.spec.loader import load_model
from tideflow.spec.step_kinds import DeviceClass
from tideflow.spec.teams import BorrowingRule, PriorityClass, Scheduling, Team, team_issues
from tideflow.spec.yamlpos import Positions


class Accelerators(SpecModel):
    device_class: Literal["gpu", "npu"] = Field(alias="class")
    model: str = Field(description="e.g. H100, A100, V100, Ascend910")
    count: strict_int(ge=1, le=64)  # type: ignore[valid-type]


class NodeGroup(SpecModel):
    """One node, or ``count`` identical nodes named ``NAME-0 .. NAME-(count-1)``."""

    name: Name
    count: strict_int(ge=1, le=100_000) = 1  # type: ignore[valid-type]
    cpu: strict_int(ge=1)  # type: ignore[valid-type]
    memory: MemoryQuantity = "0"
    accelerators: Accelerators | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class ClusterMetadata(SpecModel):
    name: Name


class ClusterSpec(SpecModel):
    api_version: Literal["tideflow/v1"] = Field(alias="apiVersion")
    kind: Literal["Cluster"]
    metadata: ClusterMetadata
    nodes: tuple[NodeGroup, ...] = Field(min_length=1)
    # Who owns which share of the nodes (tideflow.spec.teams); none: one shared pool.
    priority_classes: tuple[PriorityClass, ...] = ()
    teams: tuple[Team, ...] = ()
    borrowing: tuple[BorrowingRule, ...] = ()
    scheduling: Scheduling = Scheduling()

    @classmethod
    def cross_issues(
        cls, data: Any, result: ClusterSpec | None, file: str, positions: Positions
    ) -> list[SpecIssue]:
        """The teams' rules that span fields, checked against the declared nodes."""
        nodes = Inventory.from_spec(result) if result is not None else None

        def devices(device_class: str, model: str | None) -> int:
            if nodes is None:
                return 1 << 62  # the nodes are wrong themselves: no sum to check against
            return sum(n.offers(cast(DeviceClass, device_class), model) for n in nodes.nodes)

        return team_issues(data, file, positions, devices)

    @model_validator(mode="after")
    def _unique_names(self) -> ClusterSpec:
        names = [node.name for node in self.nodes]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise fail(f"node names repeat: {', '.join(duplicates)}", "unique node names")
        return self


@dataclass(frozen=True)
class Node:
    name: str
    cpu: int
    device_class: DeviceClass
    model: str | None
    devices: int
    labels: tuple[tuple[str, str], ...] = ()

    def offers(self, device_class: DeviceClass, model: str | None) -> int:
        """Devices of this class (and model, when one is asked for) on this node."""
        if device_class == "cpu":
            return self.cpu
        if self.device_class != device_class:
            return 0
        if model is not None and self.model != model:
            return 0
        return self.devices


@dataclass(frozen=True)
class Inventory:
    name: str
    nodes: tuple[Node, ...]
    declared: bool
    # The cluster file's teams, quotas and priority classes (None: one shared pool).
    teams: ClusterSpec | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_spec(cls, spec: ClusterSpec) -> Inventory:
        nodes = []
        for group in spec.nodes:
            names = (
                [group.name]
                if group.count == 1
                else [f"{group.name}-{i}" for i in range(group.count)]
            )
            acc = group.accelerators
            for name in names:
                nodes.append(
                    Node(
                        name=name,
                        cpu=group.cpu,
                        device_class=acc.device_class if acc else "cpu",
                        model=acc.model if acc else None,
                        devices=acc.count if acc else group.cpu,
                        labels=tuple(sorted(group.labels.items())),
                    )
                )
        teams = spec if spec.teams or spec.priority_classes else None
        return cls(spec.metadata.name, tuple(nodes), declared=True, teams=teams)

    def total(self, device_class: DeviceClass) -> int:
        return sum(node.offers(device_class, None) for node in self.nodes)

    def models(self, device_class: DeviceClass) -> list[str | None]:
        if device_class == "cpu":
            return [None]
        found = {n.model for n in self.nodes if n.device_class == device_class and n.model}
        return list(sorted(found))

    def max_gang_workers(
        self, device_class: DeviceClass, model: str | None, devices_per_worker: int
    ) -> int:
        """Most workers of one gang that could ever be placed, on an empty cluster.

        A gang never mixes device models, so without an explicit model the best
        single model counts, not the sum over models.
        """
        candidates = [model] if model is not None else self.models(device_class)
        best = 0
        for candidate in candidates:
            fit = sum(
                node.offers(device_class, candidate) // devices_per_worker for node in self.nodes
            )
            best = max(best, fit)
        return best

    def describe(self, device_class: DeviceClass, model: str | None) -> str:
        counts: dict[int, int] = defaultdict(int)
        for node in self.nodes:
            offered = node.offers(device_class, model)
            if offered:
                counts[offered] += 1
        label = device_class if model is None else f"{model} {device_class}"
        if not counts:
            return f"no node with {label} devices"
        parts = [
            f"{n} node{'s' if n != 1 else ''} with {per} {label}"
            for per, n in sorted(counts.items(), reverse=True)
        ]
        return ", ".join(parts)


def _nvidia_gpus() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def _gpu_model(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100'."""
    for token in name.replace("NVIDIA", "").split():
        if any(ch.isdigit() for ch in token) and token[0].isalpha():
            return token
    return name.strip()


def _ascend_npus() -> int:
    """Ascend NPUs through torch_npu, only when it is installed (imports torch then)."""
    import importlib.util

    if importlib.util.find_spec("torch_npu") is None:
        return 0
    try:
        import torch
        import torch_npu  # noqa: F401

        return int(torch.npu.device_count())  # type: ignore[attr-defined]
    except Exception:
        return 0


def detect_local(gpu_names: Iterable[str] | None = None) -> Inventory:
    """This machine as a one-node inventory.

    GPUs through nvidia-smi (no torch import), NPUs through torch_npu when it
    is installed. Called when steps run, never while DAGs are parsed.
    """
    names = list(_nvidia_gpus() if gpu_names is None else gpu_names)
    cpu = os.cpu_count() or 1
    npus = 0 if names or gpu_names is not None else _ascend_npus()
    if npus:
        return Inventory(
            "localhost", (Node("localhost", cpu, "npu", "Ascend", npus),), declared=False
        )
    if names:
        models = {_gpu_model(n) for n in names}
        model = models.pop() if len(models) == 1 else "mixed"
        node = Node("localhost", cpu, "gpu", model, len(names))
    else:
        node = Node("localhost", cpu, "cpu", None, cpu)
    return Inventory("localhost", (node,), declared=False)


def load_cluster(path: str | os.PathLike[str]) -> Inventory:
    """The inventory a cluster file (``kind: Cluster``) declares; ``SpecError`` if it is wrong."""
    return Inventory.from_spec(load_model(path, ClusterSpec))


def cluster_setting(path: str | os.PathLike[str]) -> Inventory:
    """The inventory of the cluster file the setting ``TIDEFLOW_CLUSTER_FILE`` names: a
    file missing or wrong is a ``ConfigError`` naming the setting, then the file's first
    problem where it is (file:line:column: field: problem) and what is accepted."""
    try:
        return load_cluster(path)
    except SpecError as exc:
        first = exc.issues[0]
        where = f"{first.file}:{first.line}:{first.column}: {first.field or '(document)'}"
        more = f" (and {len(exc.issues) - 1} more problems)" if len(exc.issues) > 1 else ""
        raise bad_setting(
            "TIDEFLOW_CLUSTER_FILE",
            str(path),
            first.accepted or "a cluster file (kind: Cluster)",
            f"{where}: {first.problem}{more}",
        ) from None


def inventory_for(cluster_file: str | os.PathLike[str] | None) -> Inventory:
    """The declared inventory when a cluster file is given, else this machine."""
    if not cluster_file:
        return detect_local()
    return load_cluster(cluster_file)
