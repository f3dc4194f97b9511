"""Hostile pipeline files: alias bombs, deep nesting and huge files are refused, located.

A pipeline file comes from anyone who can push to the repository. Each case
here once took the loader down (an alias bomb spent the DagBag's import
timeout and gigabytes; deep nesting raised RecursionError or crashed the C
composer with SIGSEGV). The CLI cases run in a subprocess under a memory limit
so a regression shows as a failed test, not a dead test runner.
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipelines.test_dag_loader import dagbag
from tests.stack.test_cli import tideflow
from tideflow.spec import SpecError, load_pipeline
from tideflow.spec.yamlpos import LIMITS

HEADER = "apiVersion: tideflow/v1\nkind: Pipeline\nmetadata: {name: bomb, team: x}\n"


def alias_bomb(levels: int = 9, fanout: int = 9) -> str:
    """The classic "billion laughs": each level lists the previous one ``fanout`` times."""
    lines = [HEADER, "x-lol:\n", '  a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol"]\n']
    for level in range(1, levels + 1):
        refs = ", ".join([f"*a{level - 1}"] * fanout)
        lines.append(f"  a{level}: &a{level} [{refs}]\n")
    return "".join(lines)


def nested(depth: int) -> str:
    return HEADER + "steps: " + "[" * depth + "]" * depth + "\n"


def _limited_memory() -> None:  # runs in the child before exec
    one_gib = 1024**3
    resource.setrlimit(resource.RLIMIT_AS, (3 * one_gib, 3 * one_gib))


def validate_in_subprocess(path: Path) -> subprocess.CompletedProcess[str]:
    """`tideflow validate` with 3 GiB of address space and a minute: enough for any sane file."""
    return subprocess.run(
        [sys.executable, "-m", "tideflow.cli", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limited_memory,
        check=False,
    )


def issue_of(path: Path) -> str:
    with pytest.raises(SpecError) as caught:
        load_pipeline(path)
    assert len(caught.value.issues) == 1, caught.value
    return str(caught.value.issues[0])


def test_alias_bomb_is_refused_at_the_alias_that_crosses_the_limit(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb())
    assert bomb.stat().st_size < 1024
    message = issue_of(bomb)
    # the sixth level is the first to pass 100,000 values (6 * 9**5 = 354,294)
    assert message.startswith(f"{bomb}:10:"), message
    assert f"more than {LIMITS.max_expanded_nodes} values once its aliases are expanded" in message
    assert f"; at most {LIMITS.max_expanded_nodes} values with aliases expanded" in message


@pytest.mark.processes
def test_alias_bomb_through_the_cli_exits_one_quickly_and_small(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb(levels=12))
    result = validate_in_subprocess(bomb)
    assert result.returncode == 1, result.stderr
    assert "once its aliases are expanded" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_many_aliases_of_a_small_anchor_hit_the_alias_count(tmp_path: Path) -> None:
    path = tmp_path / "aliases.yaml"
    refs = "\n".join("  - *one" for _ in range(LIMITS.max_aliases + 1))
    path.write_text(HEADER + "x-anchor: &one 1\nx-refs:\n" + refs + "\n")
    message = issue_of(path)
    line = 6 + LIMITS.max_aliases  # the alias one past the limit
    assert message.startswith(f"{path}:{line}:5: (document): more than {LIMITS.max_aliases}")
    assert f"at most {LIMITS.max_aliases} aliases" in message


@pytest.mark.parametrize("depth", [65, 900])
def test_deep_nesting_is_located_not_a_recursion_error(tmp_path: Path, depth: int) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(nested(depth))
    message = issue_of(path)
    # the document's mapping is the first level, so the 64th '[' crosses the limit;
    # "steps: " is 7 characters, the first '[' is column 8
    assert message.startswith(f"{path}:4:{7 + LIMITS.max_depth}: (document): nesting deeper")
    assert f"at most {LIMITS.max_depth} nested mappings and lists" in message


@pytest.mark.processes
def test_nesting_a_hundred_thousand_deep_does_not_crash_the_process(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(nested(100_000))
    result = validate_in_subprocess(path)
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    assert "nesting deeper than 64 levels" in result.stdout + result.stderr


def test_a_huge_file_is_refused_by_its_size_without_reading_it_all(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("w") as handle:
        handle.write(HEADER + "description: |\n")
        line = "  " + "x" * 98 + "\n"
        for _ in range(63 * 1024 * 1024 // len(line)):
            handle.write(line)
    size = path.stat().st_size
    message = issue_of(path)
    assert message == (
        f"{path}:1:1: (document): the file has {size} bytes, over the limit of "
        f"{LIMITS.max_bytes}; a spec file of at most {LIMITS.max_bytes} bytes"
    )


def test_benign_anchors_and_aliases_still_load(repo: Path, tmp_path: Path) -> None:
    """The limits refuse only hostile files: a real pipeline that reuses a value loads."""
    text = (repo / "pipelines" / "digits.yaml").read_text()
    text = text.replace("retries: 1\n    timeout: 10m", "retries: &retries 1\n    timeout: 10m")
    text = text.replace("retries: 1\n    timeout: 30m", "retries: *retries\n    timeout: 30m")
    assert text.count("*retries") == 1
    path = tmp_path / "digits.yaml"
    path.write_text(text)
    spec = load_pipeline(path)
    assert [step.retries for step in spec.steps[:2]] == [1, 1]


def test_python_tags_are_a_located_problem_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "tag.yaml"
    path.write_text(HEADER + "steps: !!python/name:os.system ''\n")
    message = issue_of(path)
    assert message.startswith(f"{path}:4:8: (document): YAML value error:"), message
    assert "without language-specific tags" in message


@pytest.mark.processes
def test_the_cli_reports_each_limit_with_the_file_and_position(tmp_path: Path) -> None:
    (tmp_path / "bomb.yaml").write_text(alias_bomb())
    (tmp_path / "deep.yaml").write_text(nested(200))
    result = tideflow("validate", str(tmp_path))
    assert result.returncode == 1
    shown = result.stdout + result.stderr
    assert f"{tmp_path / 'bomb.yaml'}:10:" in shown
    assert f"{tmp_path / 'deep.yaml'}:4:71: (document): nesting deeper than 64" in shown
    assert "0 of 2 pipeline file(s) valid" in shown


def test_an_alias_bomb_does_not_hide_the_other_pipelines_from_airflow(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copy(repo / "pipelines" / "digits.yaml", tmp_path / "digits.yaml")
    (tmp_path / "bomb.yaml").write_text(alias_bomb(levels=12))
    (tmp_path / "deep.yaml").write_text(nested(100_000))
    monkeypatch.setenv("TIDEFLOW_PIPELINES_DIR", str(tmp_path))
    bag = dagbag(repo)
    assert bag.dag_ids == ["digits"]
    assert sorted(bag.import_errors) == [str(tmp_path / "bomb.yaml"), str(tmp_path / "deep.yaml")]
    assert "once its aliases are expanded" in bag.import_errors[str(tmp_path / "bomb.yaml")]
    assert "nesting deeper than 64" in bag.import_errors[str(tmp_path / "deep.yaml")]
