"""Property-based fuzzing of the spec loader: any text gives a spec or located problems.

Three sources of input: arbitrary text, character-level mutations of the real
pipelines (with YAML's special tokens mixed in: anchors, aliases, tags,
flow brackets, document markers), and structural mutations (a value anywhere
in a valid pipeline replaced by an arbitrary YAML value). For each, loading
must return a frozen spec or raise ``SpecError`` whose every issue names the
file and a position, within a per-example deadline and a bounded peak of
memory. Examples are derandomized so CI is repeatable;
``TIDEFLOW_FUZZ_EXAMPLES`` raises the count for a longer local run.
"""

from __future__ import annotations

import os
import tracemalloc
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tideflow.inventory import ClusterSpec
from tideflow.spec import SpecError
from tideflow.spec.loader import parse_model
from tideflow.spec.models import PipelineSpec

ROOT = Path(__file__).resolve().parent.parent
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
