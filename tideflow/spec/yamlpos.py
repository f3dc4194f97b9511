"""Load YAML while remembering where every key and value came from.

PyYAML's composer gives each node a start mark; we keep those marks in an index
keyed by the path of the value (``("steps", 2, "gang_training", "workers")``) so
that validation errors, which only know a path, can be reported at a file
position. Duplicate keys, which PyYAML silently overwrites, are reported too.

A pipeline file comes from whoever can push to the repository, and one file's
YAML must not take the DAG processor down with it. Before anything is built,
the event stream is scanned against ``YamlLimits``: file size, nesting depth,
the number of aliases and the size of the document once aliases are expanded
(a few kB of nested aliases, a "billion laughs", expand to gigabytes). The scan
stops at the first limit crossed, so a hostile file costs at most a few
milliseconds; it is reported as ``file:line:col: problem; accepted`` naming
the limit.
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


@dataclass(frozen=True)
class YamlLimits:
    """What one spec file may use. Real pipelines stay far below every limit."""

    max_bytes: int = 1024 * 1024
    max_depth: int = 64
    max_aliases: int = 1000
    max_expanded_nodes: int = 100_000  # nodes of the document with every alias expanded


LIMITS = YamlLimits()


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
        try:
            return self._scalars.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
            # explicit tags reach PyYAML's constructors unchecked: `!!int x`, `!!binary %`
            raise _BadValueError(node, exc) from exc


class _BadValueError(Exception):
    """A scalar PyYAML cannot construct; carries the node for its position."""

    def __init__(self, node: yaml.Node, cause: Exception) -> None:
        super().__init__(str(cause))
        self.node = node
        self.cause = cause


def too_large(size: int, file: str, limits: YamlLimits = LIMITS) -> SpecIssue | None:
    """The issue for a file of ``size`` bytes over the size limit, if it is."""
    if size <= limits.max_bytes:
        return None
    return SpecIssue(
        file,
        1,
        1,
        "",
        f"the file has {size} bytes, over the limit of {limits.max_bytes}",
        f"a spec file of at most {limits.max_bytes} bytes",
    )


def _limit_issue(event: yaml.Event, file: str, problem: str, accepted: str) -> SpecIssue:
    mark = event.start_mark
    line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
    return SpecIssue(file, line, col, "", problem, accepted)


def check_limits(text: str, file: str, limits: YamlLimits = LIMITS) -> SpecIssue | None:
    """The first limit ``text`` crosses, located at the event that crossed it, or None.

    Walks the parser's events without building anything. Expanded size is
    counted per anchor, so an alias costs what its anchored node would cost if
    copied. Syntax errors are left to the composer, which reports them better.
    """
    oversize = too_large(len(text.encode("utf-8", "surrogatepass")), file, limits)
    if oversize is not None:
        return oversize
    expanded = 0  # nodes so far, aliases expanded
    aliases = 0
    anchored: dict[str, int] = {}  # anchor -> expanded size of its node
    open_collections: list[tuple[str | None, int]] = []  # (anchor, `expanded` at its start)
    try:
        for event in yaml.parse(text, Loader=_Loader):
            if isinstance(event, yaml.CollectionStartEvent):
                open_collections.append((event.anchor, expanded))
                expanded += 1
                if len(open_collections) > limits.max_depth:
                    return _limit_issue(
                        event,
                        file,
                        f"nesting deeper than {limits.max_depth} levels",
                        f"at most {limits.max_depth} nested mappings and lists",
                    )
            elif isinstance(event, yaml.CollectionEndEvent):
                anchor, started = open_collections.pop()
                if anchor is not None:
                    anchored[anchor] = expanded - started
            elif isinstance(event, yaml.ScalarEvent):
                expanded += 1
                if event.anchor is not None:
                    anchored[event.anchor] = 1
            elif isinstance(event, yaml.AliasEvent):
                aliases += 1
                if aliases > limits.max_aliases:
                    return _limit_issue(
                        event,
                        file,
                        f"more than {limits.max_aliases} aliases",
                        f"at most {limits.max_aliases} aliases (*name) per file",
                    )
                expanded += anchored.get(event.anchor or "", 1)
            else:
                continue
            if expanded > limits.max_expanded_nodes:
                return _limit_issue(
                    event,
                    file,
                    f"the document expands to more than {limits.max_expanded_nodes} "
                    "values once its aliases are expanded",
                    f"at most {limits.max_expanded_nodes} values with aliases expanded; "
                    "write the repeated parts out or use fewer nested aliases",
                )
    except yaml.YAMLError:
        return None  # the composer reports it with its position
    return None


def load_yaml(text: str, file: str, limits: YamlLimits = LIMITS) -> LoadedYaml:
    """Parse one YAML document; syntax errors come back as issues, never as exceptions."""
    over = check_limits(text, file, limits)
    if over is not None:
        return LoadedYaml(None, Positions(), [over])
    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        context = exc.context or ""
        if context and exc.context_mark is not None:
            context += f" started at {exc.context_mark.line + 1}:{exc.context_mark.column + 1},"
        problem = " ".join(part for part in (context, exc.problem) if part)
        lines = text.splitlines()
        at = lines[line - 1][col - 1 : col] if line <= len(lines) else ""
        fix = (
            "indent with spaces: YAML allows no tabs in indentation"
            if at == "\t"
            else "fix the YAML syntax (indentation, quotes, ':' after keys)"
        )
        issue = SpecIssue(file, line, col, "", f"YAML syntax error: {problem}", fix)
        return LoadedYaml(None, Positions(), [issue])
    except yaml.YAMLError as exc:
        issue = SpecIssue(file, 1, 1, "", f"YAML error: {exc}", "a single YAML document")
        return LoadedYaml(None, Positions(), [issue])
    if root is None:
        return LoadedYaml(None, Positions(), [])
    builder = _Builder(file)
    try:
        data = builder.build(root, ())
    except _BadValueError as bad:  # a tag the safe constructor refuses, `!!int abc`, bad !!binary
        cause = bad.cause
        detail = cause.problem or cause.context if isinstance(cause, yaml.MarkedYAMLError) else None
        line, col = _mark(bad.node)
        issue = SpecIssue(
            file,
            line,
            col,
            "",
            f"YAML value error: {detail or cause}",
            "plain YAML values (strings, numbers, booleans, null, lists, mappings) "
            "without language-specific tags",
        )
        return LoadedYaml(None, Positions(), [*builder.issues, issue])
    return LoadedYaml(data, builder.positions, builder.issues)
