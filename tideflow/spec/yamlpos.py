"""Load YAML while remembering where every key and value came from.

PyYAML's composer gives each node a start mark; we keep those marks in an index
keyed by the path of the value (``("steps", 2, "gang_training", "workers")``) so
that validation errors, which only know a path, can be reported at a file
position. Duplicate keys, which PyYAML silently overwrites, are reported too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from tideflow.spec.errors import SpecIssue

Path = tuple[str | int, ...]

try:  # the C composer is several times faster and gives the same marks
    _Loader: type[yaml.SafeLoader] = yaml.CSafeLoader  # type: ignore[assignment]
except AttributeError:  # pragma: no cover - PyYAML built without libyaml
    _Loader = yaml.SafeLoader


@dataclass
class Positions:
    """1-based (line, column) of each value and each mapping key, by path."""

    values: dict[Path, tuple[int, int]] = field(default_factory=dict)
    keys: dict[Path, tuple[int, int]] = field(default_factory=dict)

    def of_value(self, path: Path) -> tuple[int, int]:
        """Position of the value at ``path``, or of its nearest ancestor that exists."""
        for end in range(len(path), -1, -1):
            found = self.values.get(path[:end])
            if found is not None:
                return found
        return (1, 1)

    def of_key(self, path: Path) -> tuple[int, int]:
        """Position of the key that names ``path`` (falls back to the value)."""
        return self.keys.get(path) or self.of_value(path)


@dataclass
class LoadedYaml:
    data: Any
    positions: Positions
    issues: list[SpecIssue]


def _mark(node: yaml.Node) -> tuple[int, int]:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


def format_path(path: Path) -> str:
    """Render a path the way users write it: ``steps[2].gang_training.workers``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


class _Builder:
    def __init__(self, file: str) -> None:
        self.file = file
        self.positions = Positions()
        self.issues: list[SpecIssue] = []
        # Used only to turn scalar nodes into Python values with YAML 1.1 rules
        self._scalars = yaml.SafeLoader("")

    def build(self, node: yaml.Node, path: Path) -> Any:
        self.positions.values[path] = _mark(node)
        if isinstance(node, yaml.MappingNode):
            result: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = self.build(key_node, (*path, "<key>"))
                if not isinstance(key, str):
                    line, col = _mark(key_node)
                    self.issues.append(
                        SpecIssue(
                            self.file,
                            line,
                            col,
                            format_path(path),
                            f"mapping key {key!r} is not a string",
                            "keys are plain names such as 'name' or 'steps'",
                        )
                    )
                    continue
                child = (*path, key)
                if key in result:
                    line, col = _mark(key_node)
                    self.issues.append(
                        SpecIssue(
                            self.file,
                            line,
                            col,
                            format_path(child),
                            f"duplicate key '{key}' (the earlier value would be lost)",
                            "each key may appear once per mapping",
                        )
                    )
                    continue
                self.positions.keys[child] = _mark(key_node)
                result[key] = self.build(value_node, child)
            self.positions.values.pop((*path, "<key>"), None)
            return result
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, (*path, index)) for index, item in enumerate(node.value)]
        return self._scalars.construct_object(node, deep=True)


def load_yaml(text: str, file: str) -> LoadedYaml:
    """Parse one YAML document; syntax errors come back as issues, never as exceptions."""
    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        context = exc.context or ""
        if context and exc.context_mark is not None:
            context += f" started at {exc.context_mark.line + 1}:{exc.context_mark.column + 1},"
        problem = " ".join(part for part in (context, exc.problem) if part)
        issue = SpecIssue(
            file,
            line,
            col,
            "",
            f"YAML syntax error: {problem}",
            "fix the YAML syntax (indentation, quotes, ':' after keys)",
        )
        return LoadedYaml(None, Positions(), [issue])
    except yaml.YAMLError as exc:
        issue = SpecIssue(file, 1, 1, "", f"YAML error: {exc}", "a single YAML document")
        return LoadedYaml(None, Positions(), [issue])
    if root is None:
        return LoadedYaml(None, Positions(), [])
    builder = _Builder(file)
    data = builder.build(root, ())
    return LoadedYaml(data, builder.positions, builder.issues)
