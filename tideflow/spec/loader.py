"""Read spec files: YAML text -> validated, frozen model, or every problem at once."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar, get_args

from pydantic import BaseModel, ValidationError

from tideflow.spec.checks import ClusterCapacity, cross_step_issues
from tideflow.spec.errors import SpecError, SpecIssue
from tideflow.spec.models import PipelineSpec
from tideflow.spec.report import issues_from_validation
from tideflow.spec.yamlpos import (
    LIMITS,
    LoadedYaml,
    Positions,
    format_path,
    load_yaml,
    too_large,
)
from tideflow.storage.roots import StoreRootError, check_root

M = TypeVar("M", bound=BaseModel)
PIPELINE_SUFFIXES = (".yaml", ".yml")
FILE_KINDS = {"Pipeline": "a pipeline file", "Cluster": "a cluster file"}


def _kind_wanted(model: type[BaseModel]) -> str:
    """``a pipeline file (kind: Pipeline)``: the file ``model`` reads, in the user's words."""
    field = model.model_fields.get("kind")
    kind = next(iter(get_args(field.annotation)), None) if field else None
    return f"{FILE_KINDS[kind]} (kind: {kind})" if kind in FILE_KINDS else f"a {model.__name__}"


def _other_kind(loaded: LoadedYaml, file: str, model: type[BaseModel]) -> SpecIssue | None:
    """A file of tideflow's other kind: that alone is its problem, not each of its fields
    the wanted kind lacks (a pipeline file named by ``--cluster``)."""
    given = loaded.data.get("kind") if isinstance(loaded.data, dict) else None
    wanted = _kind_wanted(model)
    if not isinstance(given, str) or given not in FILE_KINDS or f"(kind: {given})" in wanted:
        return None
    line, column = loaded.positions.of_value(("kind",))
    return SpecIssue(
        file,
        line,
        column,
        "kind",
        f"this is {FILE_KINDS[given]} (kind: {given})",
        f"{wanted} is wanted here",
    )


def display_path(path: Path) -> str:
    """Paths relative to the working directory when inside it: shorter and clickable."""
    try:
        return os.path.relpath(path) if not os.path.relpath(path).startswith("..") else str(path)
    except ValueError:
        return str(path)


def _read(path: Path) -> tuple[str | None, list[SpecIssue]]:
    shown = display_path(path)
    try:
        with open(path, "rb") as handle:  # read one byte past the limit, never the whole file
            data = handle.read(LIMITS.max_bytes + 1)
            oversize = too_large(len(data), shown)
            if oversize is not None:
                size = os.fstat(handle.fileno()).st_size
                return None, [too_large(size, shown) or oversize]
        return data.decode("utf-8"), []
    except FileNotFoundError:
        return None, [SpecIssue(shown, 1, 1, "", "file not found", "an existing YAML file")]
    except (OSError, UnicodeDecodeError) as exc:
        return None, [SpecIssue(shown, 1, 1, "", f"cannot read file: {exc}", "a UTF-8 text file")]


StoreRoots = Callable[[str], Sequence[str]]  # team -> the checkpoint store roots it may use


def parse_model(
    text: str,
    file: str,
    model: type[M],
    inventory: ClusterCapacity | None = None,
    store_roots: StoreRoots | None = None,
    *,
    source_dir: Path | None = None,
) -> M:
    """Validate ``text`` as ``model``; raise ``SpecError`` with all problems found.

    ``inventory`` enables the gang-fit check, ``store_roots`` the check that
    each gang's checkpoint store is under a root its team may use. A pipeline's
    ``code.path`` is resolved against ``source_dir`` (default: ``file``'s
    directory) and must be a directory there.
    """
    loaded = load_yaml(text, file)
    issues = list(loaded.issues)
    if loaded.data is None and not issues:
        issues.append(SpecIssue(file, 1, 1, "", "the file is empty", _kind_wanted(model)))
    if issues and loaded.data is None:
        raise SpecError(file, issues)
    other = _other_kind(loaded, file, model)
    if other is not None:
        raise SpecError(file, [other])
    result: M | None = None
    try:
        result = model.model_validate(loaded.data)
    except ValidationError as exc:
        issues.extend(issues_from_validation(exc, model, file, loaded.positions))
    if model is PipelineSpec:
        issues.extend(cross_step_issues(loaded.data, file, loaded.positions, inventory))
    cross_issues = getattr(model, "cross_issues", None)  # a model's own cross-field rules
    if cross_issues is not None:
        issues.extend(cross_issues(loaded.data, result, file, loaded.positions))
    if isinstance(result, PipelineSpec):
        result._source_dir = Path(os.path.abspath(source_dir or Path(file).parent))
        issues.extend(_code_issues(result, file, loaded.positions))
    if isinstance(result, PipelineSpec) and store_roots is not None:
        issues.extend(_store_issues(result, file, loaded.positions, store_roots))
    if issues or result is None:
        raise SpecError(file, issues)
    return result


def _code_issues(spec: PipelineSpec, file: str, positions: Positions) -> list[SpecIssue]:
    """``code.path`` must be a directory, where the pipeline file says it is."""
    directory = spec.code_dir()
    if directory is None or directory.is_dir():
        return []
    path = ("code", "path")
    line, col = positions.of_value(path)
    what = "is not a directory" if directory.exists() else "does not exist"
    return [
        SpecIssue(
            file,
            line,
            col,
            format_path(path),
            f"code directory {display_path(directory)} {what}",
            "a directory of Python modules, relative to the pipeline file's directory "
            f"({display_path(spec.source_dir or Path.cwd())}) or absolute",
        )
    ]


def _store_issues(
    spec: PipelineSpec, file: str, positions: Positions, store_roots: StoreRoots
) -> list[SpecIssue]:
    issues = []
    allowed = list(store_roots(spec.metadata.team))
    for index, step in enumerate(spec.steps):
        store = step.gang_training.checkpoint.store if step.gang_training else None
        if store is None or "{{" in store:  # a templated root is checked when the gang starts
            continue
        try:
            check_root(store, spec.metadata.team, allowed)
        except StoreRootError as exc:
            path = ("steps", index, "gang_training", "checkpoint", "store")
            line, col = positions.of_value(path)
            issues.append(
                SpecIssue(
                    file,
                    line,
                    col,
                    format_path(path),
                    str(exc).split("; ", 1)[0],
                    "a root under "
                    + (" or ".join(allowed) or "the artifact root")
                    + ", or no store (the artifact root)",
                )
            )
    return issues


def load_model(
    path: str | os.PathLike[str],
    model: type[M],
    inventory: ClusterCapacity | None = None,
    store_roots: StoreRoots | None = None,
) -> M:
    """Read and validate a spec file as ``model`` (the checks ``parse_model`` documents)."""
    file = Path(path)
    text, issues = _read(file)
    if text is None:
        raise SpecError(display_path(file), issues)
    return parse_model(
        text, display_path(file), model, inventory, store_roots, source_dir=file.absolute().parent
    )


def load_pipeline(
    path: str | os.PathLike[str],
    inventory: ClusterCapacity | None = None,
    store_roots: StoreRoots | None = None,
) -> PipelineSpec:
    """Load and validate a pipeline file (the checks ``parse_model`` documents)."""
    return load_model(path, PipelineSpec, inventory, store_roots)


CLUSTER_KIND = "Cluster"


def document_kind(path: str | os.PathLike[str]) -> str:
    """``Cluster`` for a cluster file, else ``Pipeline``: what a spec file says it is.

    A file says so with its top-level ``kind:``; without either kind, top-level
    ``nodes`` and no ``steps`` is a cluster file's shape. A file that cannot be read or
    parsed counts as a pipeline, so its problems are reported as before.
    """
    text, _ = _read(Path(path))
    data = load_yaml(text, display_path(Path(path))).data if text is not None else None
    if not isinstance(data, dict):
        return "Pipeline"
    kind = data.get("kind")
    if kind in (CLUSTER_KIND, "Pipeline"):
        return str(kind)
    return CLUSTER_KIND if "nodes" in data and "steps" not in data else "Pipeline"


def find_pipelines(directory: str | os.PathLike[str]) -> list[Path]:
    """Pipeline files under ``directory``, sorted; files starting with '_' or '.' are skipped.

    ``directory`` may also be a single pipeline file.
    """
    root = Path(directory)
    if root.is_file():
        return [root]
    found = [
        p
        for p in root.rglob("*")
        if p.suffix in PIPELINE_SUFFIXES
        and p.is_file()
        and not any(part.startswith(("_", ".")) for part in p.relative_to(root).parts)
    ]
    return sorted(found)
