"""Resource quantities ("500m", "64", "256Gi", "1e3") as numbers, per the Kubernetes
Quantity format (k8s.io/apimachinery pkg/api/resource, "Quantity" in the API reference),
and Volcano's resource arithmetic (volcano pkg/scheduler/api/resource_info.go NewResource,
Add, LessPartly, String), reimplemented."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_SUFFIX = {
    "": 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")


def quantity(value: Any) -> float:
    """A quantity's value in base units; ValueError for text that is no quantity."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    match = _QUANTITY.match(str(value).strip())
    if not match:
        raise ValueError(f"quantities must match the regular expression {_QUANTITY.pattern!r}")
    number = float(match.group(1) + (match.group(2) or ""))
    return number * _SUFFIX[match.group(3) or ""]


def is_scalar(name: str) -> bool:
    """Extended (domain-prefixed, not kubernetes.io) and hugepages resources are scalars."""
    if name.startswith("hugepages-"):
        return True
    return "/" in name and not name.split("/", maxsplit=1)[0].endswith("kubernetes.io")


@dataclass
class VolcanoResource:
    """volcano resource_info.go Resource: milli-CPU, memory bytes, scalars in milli-units."""

    milli_cpu: float = 0.0
    memory: float = 0.0
    scalars: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, resources: dict[str, Any] | None) -> VolcanoResource:
        found = cls()
        for name, value in (resources or {}).items():
            if name == "cpu":
                found.milli_cpu += quantity(value) * 1000
            elif name == "memory":
                found.memory += quantity(value)
            elif name == "pods":
                found.scalars[name] = found.scalars.get(name, 0.0) + quantity(value)
            elif name.startswith("count/"):
                continue
            elif is_scalar(name) or name == "ephemeral-storage":
                found.scalars[name] = found.scalars.get(name, 0.0) + quantity(value) * 1000
        return found

    def add(self, other: VolcanoResource) -> VolcanoResource:
        self.milli_cpu += other.milli_cpu
        self.memory += other.memory
        for name, value in other.scalars.items():
            self.scalars[name] = self.scalars.get(name, 0.0) + value
        return self

    def less_partly(self, other: VolcanoResource) -> bool:
        """True when some dimension of self is below other's (absent scalars of self count
        as less, with DimensionDefaultValue Zero)."""
        if self.milli_cpu < other.milli_cpu or self.memory < other.memory:
            return True
        if any(name not in self.scalars for name in other.scalars):
            return True
        return any(value < other.scalars.get(name, 0.0) for name, value in self.scalars.items())

    def names(self) -> list[str]:
        found = ["cpu"] if self.milli_cpu >= 0.1 else []
        found += ["memory"] if self.memory >= 0.1 else []
        return found + [n for n, v in self.scalars.items() if v >= 0.1]

    def get(self, name: str) -> float:
        if name == "cpu":
            return self.milli_cpu
        if name == "memory":
            return self.memory
        return self.scalars.get(name, 0.0)

    def __str__(self) -> str:
        text = f"cpu {self.milli_cpu:0.2f}, memory {self.memory:0.2f}"
        return text + "".join(f", {n} {self.scalars[n]:0.2f}" for n in sorted(self.scalars))
