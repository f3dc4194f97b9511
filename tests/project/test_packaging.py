"""Packaging and layering: one import root, the plugin entry point, core free of Airflow."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

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


@pytest.mark.processes
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


@pytest.mark.processes
def test_layering_contracts_hold(repo: Path) -> None:
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint_imports, "import-linter is part of the dev extra"
    done = subprocess.run([lint_imports], cwd=repo, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "0 broken" in done.stdout


def _platform_torch(repo: Path) -> str:
    extra = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (torch,) = [r for r in extra["platform"] if r.replace(" ", "").startswith("torch")]
    return torch


def test_torch_is_a_range_a_gpu_image_keeps(repo: Path) -> None:
    from packaging.requirements import Requirement

    wanted = Requirement(_platform_torch(repo)).specifier
    pinned = [
        line.split("==", 1)[1]
        for line in (repo / "deploy/local/constraints.txt").read_text().splitlines()
        if line.startswith("torch==")
    ]
    assert pinned and all(wanted.contains(v) for v in pinned), (wanted, pinned)
    # the builds GPU images carry: CUDA wheels and NGC's pre-releases of the lowest version
    for kept in ("2.11.0+cu128", "2.11.0a0+5228986c39.nv26.01", "2.13.0+cu130"):
        assert wanted.contains(kept, prereleases=True), kept
    for refused in ("2.10.0", "2.14.0"):
        assert not wanted.contains(refused, prereleases=True), refused


@pytest.mark.processes
def test_the_gpu_example_pipeline_is_valid_and_asks_for_gpus(repo: Path) -> None:
    example = repo / "docs/examples/digits-gpu.yaml"
    checked = subprocess.run(
        [sys.executable, "-m", "tideflow.cli", "validate", str(example)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    workflow = subprocess.run(
        [sys.executable, "-m", "tideflow.cli", "compile", "--target", "argo", str(example)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "nvidia.com/gpu: '1'" in workflow
    assert "image: registry.example.com/tideflow-gpu:0.2.0" in workflow
