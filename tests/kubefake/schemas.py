"""Object validation as the API server does it before any webhook sees the object.

* Custom resources: the CRD's ``openAPIV3Schema`` from ../shared/schemas (read by
  path, never copied). Defaults in the schema are applied first (structural
  defaulting, "Defaulting" in the CRD documentation); then types, enums and
  required fields are checked with jsonschema, fields the schema does not know
  are refused (as with ``fieldValidation=Strict``: 400 ``strict decoding
  error``, except where the schema preserves unknown fields), and the schema's
  ``x-kubernetes-validations`` CEL rules are evaluated with cel-python
  (transition rules, those using ``oldSelf``, only on an update where the old
  value exists, as "Transition rules" in the CRD documentation describes).
* Built-in kinds: the ``kubernetes-validate`` package (the Kubernetes OpenAPI
  schema, strict).

A schema failure is a 422 Invalid whose causes read ``<path>: <why>``.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.kubefake.resources import Resource
from tests.kubefake.status import ApiError, invalid

SCHEMAS = Path(__file__).resolve().parents[3] / "shared" / "schemas"
K8S_VERSION = "1.33"


@functools.cache
def _crd(relative: str) -> dict[str, Any]:
    path = SCHEMAS / relative
    if not path.is_file():
        import pytest

        # A clone without ../shared (a user's): the fake cannot check custom resources
        # against upstream's schemas, so what needs them skips, saying why.
        pytest.skip(f"needs the upstream CRD {path} (../shared/schemas is not here)")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: the CRDs are large
    loaded: dict[str, Any] = yaml.load(path.read_text(), Loader=loader)
    return loaded


def crd_schema(relative: str, version: str) -> dict[str, Any]:
    (found,) = [v for v in _crd(relative)["spec"]["versions"] if v["name"] == version]
    return copy.deepcopy(dict(found["schema"]["openAPIV3Schema"]))


def unknown_fields(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    problems = []
    if isinstance(value, dict) and "properties" in schema:
        for key, item in value.items():
            if key in schema["properties"]:
                problems += unknown_fields(item, schema["properties"][key], f"{path}.{key}")
            elif not schema.get("additionalProperties"):
                problems.append(f"{path}.{key}")
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, item in value.items():
            problems += unknown_fields(item, schema["additionalProperties"], f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            problems += unknown_fields(item, schema["items"], f"{path}[{index}]")
    return problems


def schema_errors(obj: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft7Validator(schema)
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)
    ]


def validate(obj: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """Schema problems and unknown fields of ``obj`` (the checks tests ran before the fake)."""
    return schema_errors(obj, schema) + [f"{p}: unknown field" for p in unknown_fields(obj, schema)]


def apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """Fill in the schema's ``default`` values where the object leaves a field out."""
    if isinstance(value, dict):
        for key, child in (schema.get("properties") or {}).items():
            if key not in value and "default" in child:
                value[key] = copy.deepcopy(child["default"])
            if key in value:
                apply_defaults(value[key], child)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for item in value.values():
                apply_defaults(item, extra)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            apply_defaults(item, schema["items"])
    return value


@functools.cache
def _program(expression: str) -> Any:
    import celpy

    env = celpy.Environment()
    return env.program(env.compile(expression))


def _json_type(value: Any) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return "string"


def _holds(rule: str, value: Any, old: Any, has_old: bool) -> bool:
    import celpy
    from celpy import celtypes

    activation = {"self": celpy.json_to_cel(value)}
    if has_old:
        activation["oldSelf"] = celpy.json_to_cel(old)
    try:
        result = _program(rule).evaluate(activation)
    except celpy.CELEvalError:
        return False
    return isinstance(result, celtypes.BoolType) and bool(result)


def cel_violations(
    value: Any, schema: dict[str, Any], *, old: Any = None, has_old: bool = False, path: str = ""
) -> list[str]:
    """The messages of the ``x-kubernetes-validations`` rules ``value`` breaks."""
    found = []
    for rule in schema.get("x-kubernetes-validations") or []:
        expression = rule["rule"]
        if "oldSelf" in expression and not has_old:
            continue  # a transition rule: only on an update with an old value
        if not _holds(expression, value, old, has_old):
            message = rule.get("message") or f"failed rule: {expression}"
            found.append(f'{path or "<root>"}: Invalid value: "{_json_type(value)}": {message}')
    if isinstance(value, dict):
        for key, child in (schema.get("properties") or {}).items():
            if key in value:
                child_old = old.get(key) if has_old and isinstance(old, dict) else None
                found += cel_violations(
                    value[key],
                    child,
                    old=child_old,
                    has_old=has_old and isinstance(old, dict) and key in old,
                    path=f"{path}.{key}" if path else key,
                )
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, item in value.items():
                found += cel_violations(item, extra, path=f"{path}[{key}]")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            found += cel_violations(item, schema["items"], path=f"{path}[{index}]")
    return found


def _strict_unknown(path: str) -> ApiError:
    return ApiError(400, f'strict decoding error: unknown field "{path.lstrip(".")}"')


class Validator:
    """Validation and defaulting for one resource."""

    def __init__(self, resource: Resource) -> None:
        self.resource = resource
        self.schema = crd_schema(resource.crd, resource.version) if resource.crd else None

    def default(self, obj: dict[str, Any]) -> dict[str, Any]:
        if self.schema is not None:
            apply_defaults(obj, self.schema)
        return obj

    def check(self, obj: dict[str, Any], old: dict[str, Any] | None = None) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        kind, group = self.resource.kind, self.resource.group
        if self.schema is None:
            self._check_core(obj)
            return
        unknown = unknown_fields(obj, self.schema)
        if unknown:
            raise _strict_unknown(unknown[0])
        problems = schema_errors(obj, self.schema)
        problems += cel_violations(obj, self.schema, old=old, has_old=old is not None)
        if problems:
            raise invalid(kind, group, name, problems)

    def _check_core(self, obj: dict[str, Any]) -> None:
        for exc in core_errors(obj):
            path = ".".join(str(p) for p in exc.path)
            if exc.validator == "additionalProperties":
                field = str(exc.message).split("'")[1] if "'" in str(exc.message) else ""
                raise _strict_unknown(f"{path}.{field}" if path else field) from None
            name = (obj.get("metadata") or {}).get("name", "")
            raise invalid(
                self.resource.kind, self.resource.group, name, [f"{path}: {exc.message}"]
            ) from None


def core_errors(obj: dict[str, Any]) -> Iterator[Any]:
    """What kubernetes-validate finds wrong with a core object (strict, ``K8S_VERSION``),
    first problem first, as its ``validate`` raises it."""
    return _core_validator(obj["kind"], obj["apiVersion"]).iter_errors(obj)


@functools.cache
def _core_validator(kind: str, api_version: str) -> Any:
    """kubernetes-validate's strict schema of ``kind``, its definitions loaded once: its
    ``validate`` reads the multi-megabyte definitions again on every call, which was most
    of a core write's time in the fake."""
    from jsonschema.validators import Draft202012Validator
    from kubernetes_validate.utils import all_versions, major_minor, schema_contents
    from referencing import Registry
    from referencing import Resource as SchemaResource

    version = [v for v in all_versions() if major_minor(v) <= K8S_VERSION][-1]
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = schema_contents(f"{folder}/{kind.lower()}-{group_version}.json", K8S_VERSION)
    definitions = schema_contents(f"{folder}/_definitions.json", K8S_VERSION)
    registry = SchemaResource.from_contents(schema) @ (
        SchemaResource.from_contents(definitions) @ Registry()
    )
    return Draft202012Validator(schema, registry=registry)


@functools.cache
def validator(resource: Resource) -> Validator:
    return Validator(resource)
