"""Reusable field types for spec models: names, durations, quantities, templates.

Each validator raises ``PydanticCustomError`` with an ``accepted`` hint so the
error formatter can say what would have been valid, not only what was wrong.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import PlainValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

TEMPLATE_PATTERN = r"^\s*\{\{.*\}\}\s*$"
_TEMPLATE = re.compile(TEMPLATE_PATTERN, re.S)
# Pipeline and step names end up as DAG ids, task ids and Kubernetes object
# names, so they follow DNS-1123 labels, with room left for generated suffixes.
NAME_PATTERN = r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$"
_NAME = re.compile(NAME_PATTERN)
_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_CPU = re.compile(r"^(\d+(\.\d+)?|\d+m)$")
_MEMORY = re.compile(r"^\d+(\.\d+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$")
_ENTRYPOINT = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")
# A container image reference (distribution/reference's grammar): an optional registry
# host (with a port), lowercase path components, an optional tag and an optional digest.
_HOST = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_PATTERN = (
    rf"^(?:{_HOST}(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
_IMAGE = re.compile(IMAGE_PATTERN)


def fail(problem: str, accepted: str) -> PydanticCustomError:
    return PydanticCustomError("tideflow", "{problem}", {"problem": problem, "accepted": accepted})


def is_template(value: object) -> bool:
    """True for a string that is one Jinja expression, e.g. ``{{ params.lr }}``."""
    return isinstance(value, str) and bool(_TEMPLATE.match(value))


def _check_name(value: Any) -> str:
    accepted = (
        "lowercase letters, digits and '-', starting with a letter, "
        "at most 40 characters (e.g. 'train-model')"
    )
    if not isinstance(value, str):
        raise fail(f"expected a name, got {type(value).__name__} {value!r}", accepted)
    if not _NAME.match(value):
        raise fail(f"'{value}' is not a valid name", accepted)
    return value


Name = Annotated[
    str,
    PlainValidator(_check_name),
    WithJsonSchema({"type": "string", "pattern": NAME_PATTERN}),
]


def parse_duration(value: Any) -> int:
    """Seconds from ``90``, ``"90s"``, ``"15m"``, ``"2h30m"`` or ``"1d"``."""
    accepted = "seconds as an integer, or a duration such as '90s', '15m', '2h30m', '1d'"
    if isinstance(value, bool):
        raise fail(f"expected a duration, got {value!r}", accepted)
    if isinstance(value, int):
        if value <= 0:
            raise fail(f"duration must be positive, got {value}", accepted)
        return value
    if isinstance(value, str):
        match = _DURATION.match(value.strip())
        if match and any(match.groups()):
            days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
            total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
            if total > 0:
                return total
    raise fail(f"'{value}' is not a duration", accepted)


def format_duration(seconds: int) -> str:
    """The shortest spelling ``parse_duration`` reads back: ``5400`` -> ``"1h30m"``."""
    if seconds <= 0:
        return f"{seconds}s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


DurationSeconds = Annotated[
    int,
    PlainValidator(parse_duration),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 1},
                {"type": "string", "pattern": r"^(\d+d)?(\d+h)?(\d+m)?(\d+s)?$"},
            ]
        }
    ),
]


def _check_cpu(value: Any) -> str:
    accepted = "a number of cores such as 2 or 0.5, or millicores such as '500m'"
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise fail(f"expected a CPU quantity, got {value!r}", accepted)
    text = str(value)
    if not _CPU.match(text) or float(text.rstrip("m") or 0) <= 0:
        raise fail(f"'{value}' is not a CPU quantity", accepted)
    return text


def cpu_cores(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


CpuQuantity = Annotated[
    str,
    PlainValidator(_check_cpu),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "exclusiveMinimum": 0},
                {"type": "string", "pattern": _CPU.pattern},
            ]
        }
    ),
]


def _check_memory(value: Any) -> str:
    accepted = "a Kubernetes memory quantity such as '512Mi', '4Gi' or a number of bytes"
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise fail(f"expected a memory quantity, got {value!r}", accepted)
    text = str(value)
    if not _MEMORY.match(text):
        raise fail(f"'{value}' is not a memory quantity", accepted)
    return text


MemoryQuantity = Annotated[
    str,
    PlainValidator(_check_memory),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": _MEMORY.pattern},
            ]
        }
    ),
]


def _check_entrypoint(value: Any) -> str | list[str]:
    accepted = (
        "'package.module:function', or a command as a list of strings "
        "such as ['python', 'prep.py', '--out', '{{ params.out }}']"
    )
    if isinstance(value, str):
        if _ENTRYPOINT.match(value):
            return value
        raise fail(f"'{value}' is not a 'module:function' reference", accepted)
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise fail(f"expected an entry point, got {value!r}", accepted)


EntryPoint = Annotated[
    str | list[str],
    PlainValidator(_check_entrypoint),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": _ENTRYPOINT.pattern},
                {"type": "array", "items": {"type": "string"}, "minItems": 1},
            ]
        }
    ),
]


def _check_image(value: Any) -> str:
    accepted = (
        "a container image reference such as 'registry.example.com/team/train:1.4' "
        "or 'registry.example.com/team/train@sha256:<digest>' (no templates)"
    )
    if not isinstance(value, str):
        raise fail(f"expected an image reference, got {type(value).__name__} {value!r}", accepted)
    if len(value) > 512 or not _IMAGE.match(value):
        raise fail(f"'{value}' is not an image reference", accepted)
    return value


ImageRef = Annotated[
    str,
    PlainValidator(_check_image),
    WithJsonSchema({"type": "string", "pattern": IMAGE_PATTERN, "maxLength": 512}),
]


# YAML 1.1, which PyYAML reads, also takes unquoted yes/no/on/off for true/false:
# "retries: yes" is a boolean, and a boolean is never accepted as a number.
_YAML_BOOLEANS = "YAML reads unquoted yes, no, on, off, true and false as booleans"


def _int_bounds(ge: int | None, le: int | None) -> str:
    if ge is not None and le is not None:
        return f"an integer between {ge} and {le}"
    if ge is not None:
        return f"an integer >= {ge}"
    if le is not None:
        return f"an integer <= {le}"
    return "an integer"


def check_int(value: Any, *, ge: int | None, le: int | None, accepted: str) -> int:
    """The one rule for an integer in a spec file: an int within bounds, never a bool or text.

    pydantic's lax ``int`` would take ``true`` (YAML's ``yes``) as 1, ``"3"`` as 3 and
    ``3.0`` as 3; a spec file says what it means, so each of those is a problem.
    """
    if isinstance(value, bool):
        raise fail(
            f"expected an integer, got the boolean {str(value).lower()} ({_YAML_BOOLEANS})",
            accepted,
        )
    if not isinstance(value, int):
        raise fail(f"expected an integer, got {type(value).__name__} {value!r}", accepted)
    if (ge is not None and value < ge) or (le is not None and value > le):
        raise fail(f"{value} is out of range", accepted)
    return value


def _int_schema(ge: int | None, le: int | None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    if ge is not None:
        schema["minimum"] = ge
    if le is not None:
        schema["maximum"] = le
    return schema


def strict_int(*, ge: int | None = None, le: int | None = None) -> Any:
    """An integer within bounds; booleans, text and floats are refused (``check_int``)."""
    accepted = _int_bounds(ge, le)

    def check(value: Any) -> int:
        return check_int(value, ge=ge, le=le, accepted=accepted)

    return Annotated[int, PlainValidator(check), WithJsonSchema(_int_schema(ge, le))]


def templated_int(*, ge: int, le: int | None = None) -> Any:
    """An integer within bounds (``check_int``), or a Jinja template resolved when the task runs."""
    accepted = f"{_int_bounds(ge, le)}, or a template such as '{{{{ params.workers }}}}'"

    def check(value: Any) -> int | str:
        if is_template(value):
            return str(value)
        return check_int(value, ge=ge, le=le, accepted=accepted)

    return Annotated[
        int | str,
        PlainValidator(check),
        WithJsonSchema(
            {"anyOf": [_int_schema(ge, le), {"type": "string", "pattern": TEMPLATE_PATTERN}]}
        ),
    ]


def _check_number(value: Any) -> float:
    accepted = "a number such as 1, 0.5 or 1e-3"
    if isinstance(value, bool):
        raise fail(
            f"expected a number, got the boolean {str(value).lower()} ({_YAML_BOOLEANS})", accepted
        )
    if not isinstance(value, (int, float)):
        raise fail(f"expected a number, got {type(value).__name__} {value!r}", accepted)
    return float(value)


StrictNumber = Annotated[float, PlainValidator(_check_number), WithJsonSchema({"type": "number"})]
"""A number (an int is taken as a float); booleans and text are refused."""


def _check_enum_value(value: Any) -> str | int | float:
    accepted = "text, an integer or a number; quote yes/no/on/off/true/false to mean the text"
    if isinstance(value, bool):
        raise fail(
            f"expected a choice, got the boolean {str(value).lower()} ({_YAML_BOOLEANS})", accepted
        )
    if not isinstance(value, (str, int, float)):
        raise fail(f"expected a choice, got {type(value).__name__} {value!r}", accepted)
    return value


EnumValue = Annotated[
    str | int | float,
    PlainValidator(_check_enum_value),
    WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "number"}]}),
]
"""One choice of an enum param: text or a number, never a boolean."""


def templated_float(*, ge: float | None = None, le: float | None = None) -> Any:
    """A number within bounds, or a Jinja template resolved when the task runs."""
    if ge is not None and le is not None:
        bounds = f" between {ge} and {le}"
    elif ge is not None:
        bounds = f" >= {ge}"
    else:
        bounds = ""
    accepted = f"a number{bounds}, or a template such as '{{{{ params.delta }}}}'"

    def check(value: Any) -> float | str:
        if is_template(value):
            return str(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise fail(f"expected a number, got {type(value).__name__} {value!r}", accepted)
        if (ge is not None and value < ge) or (le is not None and value > le):
            raise fail(f"{value} is out of range", accepted)
        return float(value)

    number: dict[str, Any] = {"type": "number"}
    if ge is not None:
        number["minimum"] = ge
    if le is not None:
        number["maximum"] = le
    return Annotated[
        float | str,
        PlainValidator(check),
        WithJsonSchema({"anyOf": [number, {"type": "string", "pattern": TEMPLATE_PATTERN}]}),
    ]
