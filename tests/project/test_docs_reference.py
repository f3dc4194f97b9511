"""The documentation: reference generated from the code, README limits, the tour's files.

The reference pages are made at build time by ``docs/hooks/reference.py`` (an
mkdocs hook); these tests load the same functions, so a command, option, field or
setting the reference would leave out fails here, before any site is built.
"""

from __future__ import annotations

import argparse
import re
import runpy
from pathlib import Path
from typing import Any

import pytest

from tideflow.cli import build_parser
from tideflow.compile.schema import cluster_schema, pipeline_schema
from tideflow.settings_registry import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
HOOK: dict[str, Any] = runpy.run_path(str(ROOT / "docs" / "hooks" / "reference.py"))
SCHEMAS = {"pipeline": pipeline_schema(), "cluster": cluster_schema()}


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return [o for a in parser._actions for o in a.option_strings if o not in ("-h", "--help")]


def test_every_cli_command_and_option_is_in_the_generated_reference() -> None:
    page = HOOK["cli_page"]()
    names = [full for full, _, _ in HOOK["commands"](build_parser())]
    assert "tideflow broker run" in names and "tideflow usage" in names
    for full, sub, _ in HOOK["commands"](build_parser()):
        section = page.split(f"## `{full}`", 1)[1].split("\n## ", 1)[0]
        for option in _options(sub):
            assert f"`{option}`" in section, f"{full} {option} is not in the CLI reference"
        for action in sub._actions:
            if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
                assert f"`{action.metavar or action.dest}`" in section, (full, action.dest)
    assert "`--version`" in page or "--version" in _options(build_parser())


def test_every_setting_of_the_registry_is_in_the_environment_reference() -> None:
    page = HOOK["environment_page"]()
    assert len(SETTINGS) > 50
    for setting in SETTINGS:
        row = next((line for line in page.splitlines() if f"| `{setting.name}` |" in line), None)
        assert row is not None, f"{setting.name} is not in the environment reference"
        assert ", ".join(setting.readers) in row


def test_every_tideflow_variable_the_code_names_is_in_the_environment_reference() -> None:
    named: set[str] = set()
    sources = ("tideflow/**/*.py", "operators/*.py", "plugins/*.py", "dags/*.py")
    for path in (p for pattern in sources for p in ROOT.glob(pattern)):
        named |= set(re.findall(r"\bTIDEFLOW_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    assert "TIDEFLOW_HOME" in named
    page = HOOK["environment_page"]()
    missing = sorted(n for n in named if f"`{n}`" not in page)
    assert not missing, f"named in the code, missing from the reference: {missing}"


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_every_file_field_is_described(kind: str) -> None:
    rows = HOOK["schema_fields"](SCHEMAS[kind], kind)
    assert rows
    undescribed = [r["path"] for r in rows if not r["description"]]
    assert not undescribed, f"describe these in docs/hooks/fields.py or the model: {undescribed}"


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_field_help_names_only_fields_that_exist(kind: str) -> None:
    paths = {r["path"] for r in HOOK["schema_fields"](SCHEMAS[kind], kind)}
    stale = sorted(set(HOOK["FIELD_HELP"][kind]) - paths)
    assert not stale, f"docs/hooks/fields.py describes {kind} fields that do not exist: {stale}"


def test_promotion_builder_and_args_are_in_the_pipeline_reference() -> None:
    page = HOOK["pipeline_page"]()
    assert "`steps[].promote_checkpoint.builder`" in page
    assert "`steps[].promote_checkpoint.args`" in page


def test_exit_codes_come_from_the_code() -> None:
    codes = [code for code, _, _ in HOOK["exit_codes"]()]
    assert all(isinstance(code, int) for code in codes), "a name in EXIT_CODE_HELP is unknown"
    assert {0, 1, 2, 3, 4, 75, 76, 77, 130, 143} == set(codes)


def test_readme_is_short_and_its_pipeline_is_an_excerpt_of_digits() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert "make demo" in readme and "make test" in readme
    snippet = re.search(r"```yaml\n(.*?)```", readme, re.S)
    assert snippet is not None
    source = (ROOT / "pipelines" / "digits.yaml").read_text().splitlines()
    position = 0
    for line in snippet.group(1).splitlines():
        try:
            position = source.index(line, position) + 1
        except ValueError:
            pytest.fail(f"README line {line!r} is not in pipelines/digits.yaml (in order)")


def test_the_tutorial_files_exist_and_the_tour_runs_on_them() -> None:
    text = HOOK["command_output"](
        "validate docs/examples/broken.yaml --cluster docs/examples/lab.yaml"
    )
    assert "unknown field 'resourcez'" in text
    assert "unknown step 'prep-dta'" in text
    assert "can never be placed on cluster 'lab'" in text
    assert text.rstrip("`\n").endswith("1")  # the exit code is shown


def test_every_page_the_site_links_exists() -> None:
    """Relative links in README.md resolve (mkdocs --strict checks the site's)."""
    readme = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if "://" not in target:
            assert (ROOT / target).exists(), target


def test_help_says_what_broker_run_and_argo_compile_do() -> None:
    """`broker run` acts on a cluster too; the Argo gang step runs the gang driver."""
    helps = {
        full: (sub.description or "", help_)
        for full, sub, help_ in HOOK["commands"](build_parser())
    }
    _, run_help = helps["tideflow broker run"]
    assert "Kubernetes" in run_help and "on the local backend" not in run_help
    compile_description, _ = helps["tideflow compile"]
    assert "gang driver" in compile_description
    assert "the gang step as a Volcano Job" not in compile_description
