"""Local paths a pipeline would carry into pods: warnings for cluster targets.

A pod has its own filesystem. A path of this machine written into a step's
args, env, command or a param's default reaches the pod as text and names
nothing there (or something else); ``code.path`` is not in the pods at all
unless ``code.image_path`` says where the image has it. These are warnings,
not errors: a path may be mounted into the pods on purpose.

A value counts as a local path when it is absolute (or a ``file://`` URI) and
exists on this machine, or lies under the home directory or the pipeline's
own directory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path as FsPath
from typing import Any

from tideflow.spec.errors import SpecIssue
from tideflow.spec.fields import is_template
from tideflow.spec.models import PipelineSpec
from tideflow.spec.yamlpos import Path, Positions, format_path

WARNING = "warning: "
REMEDY = (
    "a path the pods have (a volume mounted at the same place, or one inside the "
    "image), or a store URI such as s3://bucket/key"
)


def is_warning(issue: SpecIssue) -> bool:
    return issue.problem.startswith(WARNING)


def _local_path(value: str, roots: tuple[FsPath, ...]) -> FsPath | None:
    """The path ``value`` names on this machine, if it is one of this machine's."""
    text = value.removeprefix("file://") if value.startswith("file:///") else value
    if "{{" in text or not text.startswith("/") or text.startswith("//"):
        return None
    path = FsPath(os.path.normpath(text))
    if path == FsPath("/"):
        return None
    if path.exists() or any(root != FsPath("/") and path.is_relative_to(root) for root in roots):
        return path
    return None


def _strings(value: Any, path: Path) -> Iterator[tuple[Path, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, (*path, key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _strings(item, (*path, index))


def _carried(spec: PipelineSpec) -> Iterator[tuple[Path, str]]:
    """Every value a step hands its pods as text: args, env, command, param defaults."""
    for name, param in spec.params.items():
        yield from _strings(param.default, ("params", name, "default"))
    for index, step in enumerate(spec.steps):
        base: Path = ("steps", index, step.kind)
        body = step.body
        yield from _strings(body.args, (*base, "args"))
        yield from _strings(getattr(body, "env", {}), (*base, "env"))
        entrypoint = getattr(body, "entrypoint", None)
        if isinstance(entrypoint, list):
            yield from _strings(entrypoint, (*base, "entrypoint"))


def local_path_warnings(spec: PipelineSpec, file: str, positions: Positions) -> list[SpecIssue]:
    """Warnings for a pipeline that runs on a cluster (Kubernetes or Argo)."""
    roots = tuple(
        root for root in (FsPath.home(), spec.source_dir) if root is not None and root.is_dir()
    )
    issues = []

    def warn(path: Path, problem: str, accepted: str) -> None:
        line, col = positions.of_value(path)
        issues.append(SpecIssue(file, line, col, format_path(path), WARNING + problem, accepted))

    for path, value in _carried(spec):
        if is_template(value):
            continue
        local = _local_path(value, roots)
        if local is not None:
            warn(path, f"'{value}' is a path on this machine; pods do not have it", REMEDY)
    code = spec.code
    if code is not None and code.path is not None and code.image_path is None:
        shown = spec.code_dir()
        warn(
            ("code", "path"),
            f"code directory {shown} is on this machine; Argo step pods and gang pods do "
            "not have it",
            "code.image_path: where the step images hold the same directory (put first "
            "on PYTHONPATH in pods), or code.package for code installed in the image",
        )
    return issues
