"""Packaging and layering: one import root, the plugin entry point, core free of Airflow."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

MAPPED = {"tideflow.operators": "operators", "tideflow.plugins": "plugins"}


def test_every_package_directory_is_listed(repo: Path) -> None:
    config = tomllib.loads((repo / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(repo).parts)
        for init in (repo / "tideflow").rglob("__init__.py")
    }
    found |= {pkg for pkg, folder in MAPPED.items() if (repo / folder / "__init__.py").exists()}
    assert found == listed


def test_no_generic_top_level_names_are_installed() -> None:
    import tideflow.operators
    import tideflow.plugins

    assert tideflow.operators.__name__ == "tideflow.operators"
    for generic in ("operators", "plugins", "pipelines", "dags"):
        done = subprocess.run(
            [sys.executable, "-c", f"import {generic}"], cwd="/", capture_output=True, check=False
        )
        assert done.returncode != 0, f"a top-level '{generic}' package is importable"


def test_plugin_is_registered_through_the_entry_point() -> None:
    (plugin,) = [ep for ep in entry_points(group="airflow.plugins") if ep.name == "tideflow"]
    loaded = plugin.load()
    assert loaded.name == "tideflow"
    from airflow import plugins_manager

    infos = plugins_manager.get_plugin_info()
    assert "tideflow" in [info["name"] for info in infos]


def test_layering_contracts_hold(repo: Path) -> None:
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint_imports, "import-linter is part of the dev extra"
    done = subprocess.run([lint_imports], cwd=repo, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "0 broken" in done.stdout
