"""Label and field selectors, as the API server and Argo's executor read them.

Label selector strings follow k8s.io/apimachinery pkg/labels (selector.go Parse,
documented in "Labels and Selectors"): comma-separated requirements, all of which
must hold: ``k=v``, ``k==v``, ``k!=v`` (true when the key is absent), ``k in (a,b)``,
``k notin (a,b)`` (true when absent), ``k`` (exists), ``!k`` (absent), and
``k>n`` / ``k<n`` on integers. A requirement is checked against a lookup
function, so the same parser serves labels (a dict) and Argo's resource
conditions (a JSON path into the object, argo workflow-executor-resource.go
gjsonLabels). Structured selectors (matchLabels / matchExpressions of a
PodDisruptionBudget or a NetworkPolicy) are converted to the same requirements.
Field selectors support ``=``, ``==`` and ``!=`` on dotted paths, which covers
the ``metadata.name=<name>`` tideflow sends.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Lookup = Callable[[str], "str | None"]


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # =, !=, in, notin, exists, !, gt, lt
    values: tuple[str, ...] = ()

    def matches(self, lookup: Lookup) -> bool:
        value = lookup(self.key)
        if self.operator in ("=", "in"):
            return value is not None and value in self.values
        if self.operator in ("!=", "notin"):
            return value is None or value not in self.values
        if self.operator == "exists":
            return value is not None
        if self.operator == "!":
            return value is None
        if value is None:
            return False
        try:
            number, bound = int(value), int(self.values[0])
        except ValueError:
            return False
        return number > bound if self.operator == "gt" else number < bound

    def __str__(self) -> str:
        if self.operator in ("in", "notin"):
            return f"{self.key} {self.operator} ({','.join(self.values)})"
        if self.operator == "exists":
            return self.key
        if self.operator == "!":
            return f"!{self.key}"
        symbol = {"gt": ">", "lt": "<"}.get(self.operator, self.operator)
        return f"{self.key}{symbol}{self.values[0]}"


_SET = re.compile(r"^\s*(!?)\s*([^\s!=<>(),]+)\s+(in|notin)\s*\(([^)]*)\)\s*")
_OP = re.compile(r"^\s*([^\s!=<>(),]+)\s*(==|=|!=|>|<)\s*([^\s,()]*)\s*")
_EXISTS = re.compile(r"^\s*(!?)\s*([^\s!=<>(),]+)\s*")


def parse_selector(text: str) -> list[Requirement]:
    """A selector string's requirements; ValueError naming what cannot be read."""
    found: list[Requirement] = []
    rest = text.strip()
    while rest:
        if match := _SET.match(rest):
            if match.group(1):
                raise ValueError(f"unable to parse requirement: {rest!r}")
            values = tuple(v.strip() for v in match.group(4).split(",") if v.strip())
            found.append(Requirement(match.group(2), match.group(3), values))
        elif match := _OP.match(rest):
            key, op, value = match.groups()
            op = {"==": "=", ">": "gt", "<": "lt"}.get(op, op)
            found.append(Requirement(key, op, (value,)))
        elif match := _EXISTS.match(rest):
            found.append(Requirement(match.group(2), "!" if match.group(1) else "exists"))
        else:
            raise ValueError(f"unable to parse requirement: {rest!r}")
        rest = rest[match.end() :]
        if rest.startswith(","):
            rest = rest[1:]
        elif rest:
            raise ValueError(f"unable to parse requirement: {rest!r}")
    return found


def labels_lookup(labels: dict[str, str] | None) -> Lookup:
    labels = labels or {}
    return labels.get


def match_labels(selector: str, labels: dict[str, str] | None) -> bool:
    lookup = labels_lookup(labels)
    return all(r.matches(lookup) for r in parse_selector(selector))


def structured(selector: dict[str, Any] | None) -> list[Requirement]:
    """A metav1.LabelSelector as requirements; an empty selector matches everything."""
    selector = selector or {}
    found = [Requirement(k, "=", (v,)) for k, v in (selector.get("matchLabels") or {}).items()]
    operators = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for expression in selector.get("matchExpressions") or []:
        found.append(
            Requirement(
                expression["key"],
                operators[expression["operator"]],
                tuple(expression.get("values") or ()),
            )
        )
    return found


def match_structured(selector: dict[str, Any] | None, labels: dict[str, str] | None) -> bool:
    lookup = labels_lookup(labels)
    return all(r.matches(lookup) for r in structured(selector))


def path_value(obj: Any, path: str) -> str | None:
    """The value at a dotted path as a string (JSON scalars as JSON writes them)."""
    current = obj
    for part in path.split("."):
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return None
    if isinstance(current, bool):
        return "true" if current else "false"
    if isinstance(current, dict | list):
        import json

        return json.dumps(current, separators=(",", ":"))
    return str(current)


def match_fields(selector: str, obj: dict[str, Any]) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if path_value(obj, key.strip()) == value.strip():
                return False
            continue
        key, _, value = term.replace("==", "=").partition("=")
        if path_value(obj, key.strip()) != value.strip():
            return False
    return True
