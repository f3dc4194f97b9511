"""Property-based fuzzing of the spec loader: any text gives a spec or located problems.

Three sources of input: arbitrary text, character-level mutations of the real
pipelines (with YAML's special tokens mixed in: anchors, aliases, tags,
flow brackets, document markers), and structural mutations (a value anywhere
in a valid pipeline replaced by an arbitrary YAML value). For each, loading
must return a frozen spec or raise ``SpecError`` whose every issue names the
file and a position, within a per-example deadline and a bounded peak of
memory. A fourth property sets each integer field to any YAML boolean, any
integer or a param's template: booleans are refused at that field, integers
are accepted exactly within the field's bounds, templates always. Examples
are derandomized so CI is repeatable;
``TIDEFLOW_FUZZ_EXAMPLES`` raises the count for a longer local run.
"""

from __future__ import annotations

import os
import tracemalloc
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tideflow.inventory import ClusterSpec
from tideflow.spec import SpecError
from tideflow.spec.loader import parse_model
from tideflow.spec.models import PipelineSpec
from tideflow.spec.yamlpos import format_path, load_yaml

ROOT = Path(__file__).resolve().parents[2]
VALID = [
    (ROOT / "pipelines" / "digits.yaml").read_text(),
    (ROOT / "tests" / "data" / "pipelines" / "full.yaml").read_text(),
]
EXAMPLES = int(os.environ.get("TIDEFLOW_FUZZ_EXAMPLES", "150"))
PEAK_BYTES = 64 * 1024 * 1024  # a pipeline is a few kB; no input may cost more than this
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=timedelta(seconds=5),
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
YAML_TOKENS = [
    "&a ",
    "*a",
    "*b",
    "&b [*a, *a, *a, *a]",
    "<<: *a",
    "!!python/object:os.system ",
    "!!binary ",
    "!!set ",
    "!!timestamp ",
    "!!int ",
    "!!float .nan",
    "? ",
    "[",
    "]",
    "{",
    "}",
    "---\n",
    "...\n",
    "%YAML 1.1\n",
    "\t",
    "\n  - ",
    ": ",
    "'",
    '"',
    "|\n",
    ">-\n",
    "#",
    "\x00",
    "\ufeff",
    "é",
    "\U0001f600",
    "{{ params.x }}",
    "1e999",
    "-.inf",
    "0x1F",
    "null",
    "~",
    "yes",
]


def load_bounded(text: str, model: type[Any] = PipelineSpec) -> None:
    """Load ``text``; assert the outcome is a spec or located issues, within the memory bound."""
    tracemalloc.start()
    try:
        try:
            spec = parse_model(text, "fuzz.yaml", model)
        except SpecError as error:
            assert error.issues, "a SpecError must carry at least one issue"
            for issue in error.issues:
                assert issue.file == "fuzz.yaml"
                assert issue.line >= 1 and issue.column >= 1, issue
                assert issue.problem, issue
                assert str(issue).startswith(f"fuzz.yaml:{issue.line}:{issue.column}: ")
        else:
            assert isinstance(spec, model)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < PEAK_BYTES, f"loading used {peak} bytes at its peak"


@st.composite
def mutated_pipeline(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(VALID))
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        at = draw(st.integers(min_value=0, max_value=len(text)))
        kind = draw(st.sampled_from(["insert", "delete", "replace", "duplicate-line"]))
        if kind == "insert":
            piece = draw(st.one_of(st.sampled_from(YAML_TOKENS), st.text(max_size=8)))
            text = text[:at] + piece + text[at:]
        elif kind == "delete":
            text = text[:at] + text[at + draw(st.integers(min_value=1, max_value=40)) :]
        elif kind == "replace":
            piece = draw(st.sampled_from(YAML_TOKENS))
            text = text[:at] + piece + text[at + len(piece) :]
        else:
            lines = text.splitlines(keepends=True)
            index = draw(st.integers(min_value=0, max_value=max(len(lines) - 1, 0)))
            lines[index:index] = lines[index : index + 1] * draw(st.integers(1, 4))
            text = "".join(lines)
    return text


yaml_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)


def paths_of(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += paths_of(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += paths_of(child, (*prefix, index))
    return found


@st.composite
def restructured_pipeline(draw: st.DrawFn) -> str:
    document = yaml.safe_load(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(paths_of(document)[1:]))
        parent = document
        for part in path[:-1]:
            parent = parent[part]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(yaml_values)
    return yaml.safe_dump(document, allow_unicode=True)


@FUZZ
@given(st.text(max_size=3000))
def test_arbitrary_text_gives_a_spec_or_located_problems(text: str) -> None:
    load_bounded(text)


@FUZZ
@given(mutated_pipeline())
def test_mutated_pipelines_give_a_spec_or_located_problems(text: str) -> None:
    load_bounded(text)


@FUZZ
@given(restructured_pipeline())
def test_restructured_pipelines_give_a_spec_or_located_problems(text: str) -> None:
    load_bounded(text)


@FUZZ
@given(st.text(max_size=1500))
def test_arbitrary_cluster_files_give_a_spec_or_located_problems(text: str) -> None:
    load_bounded(text, ClusterSpec)


# Every integer field of a step, by the step kind it belongs to, with its bounds.
INTEGER_FIELDS: list[tuple[str | None, tuple[str, ...], int, int | None, bool]] = [
    # (step kind or None for the step itself, path in it, minimum, maximum, templated)
    (None, ("retries",), 0, 20, False),
    ("gang_training", ("workers",), 1, 4096, True),
    ("gang_training", ("min_workers",), 1, 4096, True),
    ("gang_training", ("devices_per_worker",), 1, 64, True),
    ("gang_training", ("max_restarts",), 0, 100, True),
    ("gang_training", ("priority",), -1000, 1000, False),
    ("gang_training", ("checkpoint", "every_steps"), 1, None, True),
    ("gang_training", ("checkpoint", "keep_last"), 1, None, True),
]
# Every spelling PyYAML (YAML 1.1) reads as a boolean.
YAML_BOOLEANS = [
    spelling
    for word in ("yes", "no", "true", "false", "on", "off")
    for spelling in (word, word.capitalize(), word.upper())
]
SLOT = "TIDEFLOW_FUZZ_SLOT"


@st.composite
def integer_field_value(draw: st.DrawFn) -> tuple[str, tuple[Any, ...], str, bool]:
    """A valid pipeline with one integer field set to a drawn value, as YAML text.

    Returns the text, the field's path, the value as written and whether it is valid.
    """
    document = yaml.safe_load(draw(st.sampled_from(VALID)))
    kind, field, low, high, templated = draw(st.sampled_from(INTEGER_FIELDS))
    steps = [i for i, step in enumerate(document["steps"]) if kind is None or kind in step]
    index = draw(st.sampled_from(steps))
    path: tuple[Any, ...] = ("steps", index, *(() if kind is None else (kind,)), *field)
    parent = document
    for part in path[:-1]:
        parent = parent.setdefault(part, {}) if isinstance(part, str) else parent[part]
    parent[path[-1]] = SLOT
    choice = draw(st.sampled_from(["boolean", "integer", "template"]))
    if choice == "boolean":
        written, valid = draw(st.sampled_from(YAML_BOOLEANS)), False
    elif choice == "integer":
        number = draw(st.integers(min_value=-5, max_value=5000))
        written, valid = str(number), low <= number and (high is None or number <= high)
    else:
        written, valid = '"{{ params.workers }}"', templated
    text = yaml.safe_dump(document, allow_unicode=True, width=1000).replace(SLOT, written)
    return text, path, written, valid


@FUZZ
@given(integer_field_value())
def test_integer_fields_refuse_booleans_and_keep_templates(
    case: tuple[str, tuple[Any, ...], str, bool],
) -> None:
    text, path, written, valid = case
    try:
        parse_model(text, "fuzz.yaml", PipelineSpec)
    except SpecError as error:
        assert not valid, f"{written} at {format_path(path)} was refused: {error}"
        at_field = [issue for issue in error.issues if issue.field == format_path(path)]
        assert len(at_field) == 1, error
        issue = at_field[0]
        line, column = load_yaml(text, "fuzz.yaml").positions.of_value(path)
        assert (issue.line, issue.column) == (line, column)
        assert issue.accepted.startswith("an integer "), issue
        if written in YAML_BOOLEANS:
            boolean = "true" if written.lower() in ("yes", "true", "on") else "false"
            assert issue.problem.startswith(
                f"expected an integer, got the boolean {boolean} (YAML reads unquoted yes"
            ), issue
    else:
        assert valid, f"{written} at {format_path(path)} was accepted"


def test_gang_priority_refuses_booleans() -> None:
    document = yaml.safe_load(VALID[0])
    gang = next(step for step in document["steps"] if "gang_training" in step)
    gang["gang_training"]["priority"] = SLOT
    text = yaml.safe_dump(document, width=1000).replace(SLOT, "yes")
    with pytest.raises(SpecError, match="priority"):
        parse_model(text, "fuzz.yaml", PipelineSpec)
