"""Turn pydantic validation errors into located, human-worded ``SpecIssue``s."""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from tideflow.spec.errors import SpecIssue
from tideflow.spec.yamlpos import Path, Positions, format_path


def did_you_mean(word: str, choices: typing.Iterable[str]) -> str:
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean '{match[0]}'? " if match else ""


def _resolve(annotation: Any, path: Path) -> type[BaseModel] | None:
    """Follow ``path`` through model fields, lists and dicts to the model found there."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _resolve(typing.get_args(annotation)[0], path)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _resolve(arg, path)
            if found is not None:
                return found
        return None
    is_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    if not path:
        return annotation if is_model else None
    part, rest = path[0], path[1:]
    if is_model and isinstance(part, str):
        by_alias = {info.alias or name: info for name, info in annotation.model_fields.items()}
        info = by_alias.get(part)
        return _resolve(info.annotation, rest) if info is not None else None
    if origin in (list, tuple) and isinstance(part, int):
        return _resolve(typing.get_args(annotation)[0], rest)
    if origin is dict and isinstance(part, str):
        return _resolve(typing.get_args(annotation)[1], rest)
    return None


def _field_names(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


def model_at(root: type[BaseModel], path: Path) -> type[BaseModel] | None:
    """The model class that validates the mapping found at ``path``, if any."""
    return _resolve(root, path)


def _describe(error: Any, root: type[BaseModel], loc: Path) -> tuple[str, str]:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    value = error.get("input")
    if kind == "tideflow":
        return ctx["problem"], ctx["accepted"]
    if kind == "extra_forbidden":
        name = str(loc[-1])
        parent = model_at(root, loc[:-1])
        fields = _field_names(parent) if parent else []
        above = model_at(root, loc[:-2]) if len(loc) > 1 else None
        if above is not None and name in _field_names(above):
            where = format_path(loc[:-2]) or "the document"
            hint = f"'{name}' is a field of {where}, one level up; "
        else:
            hint = did_you_mean(name, fields)
        return f"unknown field '{name}'", f"{hint}accepted fields: {', '.join(fields)}"
    if kind == "missing":
        return f"required field '{loc[-1]}' is missing", f"add '{loc[-1]}:'"
    if kind == "literal_error":
        return f"{value!r} is not accepted", f"one of {ctx.get('expected')}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"expected an integer, got {value!r}", "an integer"
    if kind in ("float_type", "float_parsing"):
        return f"expected a number, got {value!r}", "a number"
    if kind in ("bool_type", "bool_parsing"):
        return f"expected true or false, got {value!r}", "true or false"
    if kind == "string_type":
        return f"expected text, got {type(value).__name__} {value!r}", "a string"
    if kind == "string_pattern_mismatch":
        return f"{value!r} has the wrong form", f"text matching {ctx.get('pattern')}"
    bounds = {
        "greater_than_equal": ">=",
        "greater_than": ">",
        "less_than_equal": "<=",
        "less_than": "<",
    }
    if kind in bounds:
        limit = next(iter(ctx.values()))
        return f"{value!r} is out of range", f"a value {bounds[kind]} {limit}"
    if kind == "too_short":
        return "needs at least " + str(ctx.get("min_length")) + " item(s)", "a non-empty list"
    if kind in ("list_type", "tuple_type"):
        return f"expected a list, got {type(value).__name__}", "a YAML list ('- item' lines)"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"expected a mapping, got {type(value).__name__} {value!r}", "a YAML mapping"
    return str(error["msg"]), ""


def issues_from_validation(
    exc: ValidationError, root: type[BaseModel], file: str, positions: Positions
) -> list[SpecIssue]:
    issues = []
    errors = exc.errors(include_url=False)
    item_locs = [tuple(e["loc"]) for e in errors]
    for error in errors:
        loc: Path = tuple(error["loc"])
        # pydantic counts only the items that validated, so one bad item in a
        # required list also reports the list as too short: noise, not a problem.
        if error["type"] == "too_short" and any(
            len(other) > len(loc) and other[: len(loc)] == loc for other in item_locs
        ):
            continue
        if loc and loc[-1] == "[key]":
            loc = loc[:-1]
            line, col = positions.of_key(loc)
            problem, accepted = _describe(error, root, loc)
            problem = f"name {loc[-1]!r} is not valid ({problem})"
        else:
            if error["type"] == "extra_forbidden":
                line, col = positions.of_key(loc)
            elif error["type"] == "missing":
                line, col = positions.of_value(loc[:-1])
            else:
                line, col = positions.of_value(loc)
            problem, accepted = _describe(error, root, loc)
        issues.append(SpecIssue(file, line, col, format_path(loc), problem, accepted))
    return issues
