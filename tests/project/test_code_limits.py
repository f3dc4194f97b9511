"""Limits of the product code: no module over 400 lines, no function over 60, and no
import circle between modules. There are no exemptions: split the code.
"""

from __future__ import annotations

import ast
import tomllib
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("tideflow", "operators", "plugins", "dags", "research")
MODULE_LINES = 400
FUNCTION_LINES = 60


def measure(base: Path = REPO, roots: tuple[str, ...] = ROOTS) -> dict[str, int]:
    """Every module and function over its limit, as ``path`` or ``path:function`` -> lines."""
    over: dict[str, int] = {}
    for path in sorted(p for root in roots for p in (base / root).rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        name = path.relative_to(base).as_posix()
        lines = source.count("\n")
        if lines > MODULE_LINES:
            over[name] = lines
        for node in ast.walk(ast.parse(source, filename=name)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_LINES:
                    key = f"{name}:{node.name}"
                    over[key] = max(over.get(key, 0), length)
    return over


def test_no_module_or_function_is_over_its_limit() -> None:
    over = measure()
    assert not over, (
        f"over {MODULE_LINES} lines per module or {FUNCTION_LINES} per function: {over}"
    )


def test_the_measure_finds_long_modules_and_functions(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    (package / "fits.py").write_text(f"def fits():\n{body[: body.rindex(chr(10))]}\n")
    (package / "long.py").write_text(
        f"def long():\n{body}\n" + "\n" * (MODULE_LINES - FUNCTION_LINES)
    )
    assert measure(tmp_path, ("pkg",)) == {
        "pkg/long.py": MODULE_LINES + 1,
        "pkg/long.py:long": FUNCTION_LINES + 1,
    }


def import_order(packages: tuple[str, ...]) -> tuple[str, ...]:
    """The modules of ``packages`` in an order where each comes after what it imports,
    counting imports inside functions and type-checking blocks too: a circle there
    is a circle in the design. ``CycleError`` names a circle where there is one."""
    import grimp

    graph = grimp.build_graph(*packages, include_external_packages=False)
    imports = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    return tuple(TopologicalSorter(imports).static_order())


def test_no_module_imports_itself_through_others() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    packages = tuple(config["tool"]["importlinter"]["root_packages"])
    try:
        order = import_order(packages)
    except CycleError as exc:
        pytest.fail(f"import circle: {' -> '.join(exc.args[1])}")
    assert "tideflow.gangs.resolved" in order


def test_the_circle_check_finds_a_circle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "circled"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import circled.b\n"
    )
    (package / "b.py").write_text("def later():\n    import circled.a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(CycleError):
        import_order(("circled",))
