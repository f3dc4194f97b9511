"""Offline validation against CRD schemas in ../shared/schemas (read by path, never copied).

jsonschema checks types, enums and required fields; unknown fields are reported
as well (as ``kubectl --validate=strict`` would), except where the schema
preserves unknown fields.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

SCHEMAS = Path(__file__).resolve().parents[2] / "shared" / "schemas"


def crd_schema(relative: str, version: str) -> dict[str, Any]:
    crd = yaml.safe_load((SCHEMAS / relative).read_text())
    (found,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return dict(found["schema"]["openAPIV3Schema"])


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


def validate(obj: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft7Validator(schema)
    errors = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)
    ]
    return errors + [f"{p}: unknown field" for p in unknown_fields(obj, schema)]
