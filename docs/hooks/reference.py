"""Reference pages generated from the code at build time (`make docs`).

mkdocs loads this file as a hook (mkdocs.yml `hooks:`). On every build it adds the
reference pages made from the code itself, so they cannot drift from it: the CLI
from the argparse parser (`tideflow.cli.build_parser`), the pipeline and cluster
file fields from their JSON Schemas, the exit codes from the constants the code
uses, and the environment variables from the settings registry. Nothing it makes
is committed. `tests/project/test_docs_reference.py` loads the same functions.

A page may also ask for a command's real output: a line
`<!-- tideflow-output: validate docs/examples/broken.yaml -->` becomes a console
block with `$ tideflow ...` and what that command prints now, run in-process.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import runpy
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

GENERATED = {
    "reference/cli.md": "cli_page",
    "reference/pipeline-fields.md": "pipeline_page",
    "reference/cluster-fields.md": "cluster_page",
    "reference/exit-codes.md": "exit_codes_page",
    "reference/environment.md": "environment_page",
    "changelog.md": "changelog_page",
}
OUTPUT_MARK = re.compile(r"^<!-- tideflow-output: (.+?) -->$", re.MULTILINE)
REPO = Path(__file__).resolve().parents[2]
# What a field means where its schema has no description (fields.py; a test checks
# that every path there exists and that every field is described).
_WORDS = runpy.run_path(str(Path(__file__).with_name("fields.py")))
FIELD_HELP: dict[str, dict[str, str]] = _WORDS["FIELD_HELP"]
EXIT_CODE_HELP: list[tuple[int | str, str, str]] = _WORDS["EXIT_CODE_HELP"]
NOTE = "*Generated from the code by `docs/hooks/reference.py` at build time.*\n\n"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


# ---- the CLI ----------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help_of(parser: argparse.ArgumentParser) -> dict[str, str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {a.dest: a.help or "" for a in action._choices_actions}
    return {}


def commands(
    parser: argparse.ArgumentParser, prefix: str = "tideflow"
) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    """Every command and subcommand as (full name, parser, one-line help)."""
    helps = _help_of(parser)
    for name, sub in _subcommands(parser).items():
        full = f"{prefix} {name}"
        yield full, sub, helps.get(name, "")
        yield from commands(sub, full)


def _option_row(action: argparse.Action) -> str:
    names = (
        ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.metavar or action.dest}`"
    )
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        choices = ", ".join(f"`{c}`" for c in action.choices)
    else:
        choices = ""
    default = action.default
    unset = default in (None, False, [], argparse.SUPPRESS)
    shown = "" if unset or action.required else f"`{default}`"
    optional = action.option_strings or action.nargs in ("?", "*")
    required = "" if optional and not (action.option_strings and action.required) else "yes"
    return f"| {names} | {_cell(action.help or '')} | {choices} | {shown} | {required} |"


def cli_page() -> str:
    from tideflow.cli import build_parser

    parser = build_parser()
    out = ["# Command line\n", NOTE, f"{parser.description}\n"]
    out.append("| command | what it does |\n|---|---|")
    for full, _, help_ in commands(parser):
        anchor = full.replace(" ", "-")
        out.append(f"| [`{full}`](#{anchor}) | {_cell(help_)} |")
    out.append("\nEvery command exits 0 on success; see [exit codes](exit-codes.md).\n")
    for full, sub, _ in commands(parser):
        out.append(f"## `{full}` {{ #{full.replace(' ', '-')} }}\n")
        if sub.description:
            out.append(f"```text\n{sub.description.strip()}\n```\n")
        usage = sub.format_usage().removeprefix("usage: ").strip()
        out.append(f"```text\n{usage}\n```\n")
        actions = [a for a in sub._actions if not isinstance(a, argparse._HelpAction)]
        actions = [a for a in actions if not isinstance(a, argparse._SubParsersAction)]
        if actions:
            out.append("| argument | meaning | accepted | default | required |")
            out.append("|---|---|---|---|---|")
            out.extend(_option_row(a) for a in actions)
            out.append("")
    return "\n".join(out)


# ---- pipeline and cluster files ------------------------------------------------------


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = defs[node["$ref"].rsplit("/", 1)[-1]]
    return node


def _variants(node: dict[str, Any], defs: dict[str, Any]) -> list[dict[str, Any]]:
    options = node.get("anyOf") or node.get("oneOf") or [node]
    return [_resolve(o, defs) for o in options if o.get("type") != "null"]


def _type_text(node: dict[str, Any], defs: dict[str, Any]) -> str:
    words = []
    for v in _variants(node, defs):
        if "const" in v:
            words.append(f"`{v['const']}`")
        elif "enum" in v:
            words.append(" \\| ".join(f"`{e}`" for e in v["enum"]))
        elif v.get("type") == "array":
            item = _type_text(v.get("items", {}), defs) if v.get("items") else "any"
            words.append(f"list of {item}")
        elif v.get("type") == "object" and "properties" in v:
            words.append(f"mapping ({v.get('title', 'object')})")
        elif v.get("type") == "object":
            words.append("mapping")
        else:
            text = v.get("type", "any")
            bounds = [f"{k} {v[k]}" for k in ("minimum", "maximum", "exclusiveMinimum") if k in v]
            words.append(f"{text} ({', '.join(bounds)})" if bounds else str(text))
    if any(o.get("type") == "null" for o in node.get("anyOf", [])):
        words.append("null")
    return " or ".join(dict.fromkeys(words)) or "any"


def _children(node: dict[str, Any], defs: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The object schemas one field leads to, with the path suffix that reaches them."""
    for v in _variants(node, defs):
        if v.get("type") == "array" and v.get("items"):
            for item in _variants(v["items"], defs):
                if "properties" in item:
                    yield "[]", item
        elif "properties" in v:
            yield "", v
        elif "patternProperties" in v:
            for inner in v["patternProperties"].values():
                for item in _variants(inner, defs):
                    if "properties" in item:
                        yield ".<name>", item


def schema_fields(schema: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """Every field of a schema, depth first: path, type, default, required, description.

    ``kind`` ("pipeline" or "cluster") picks the descriptions of docs/hooks/fields.py."""
    defs = schema.get("$defs", {})
    help_ = FIELD_HELP[kind]
    rows: list[dict[str, Any]] = []

    def walk(obj: dict[str, Any], prefix: str) -> None:
        required = set(obj.get("required", ()))
        for name, node in obj.get("properties", {}).items():
            path = f"{prefix}{name}"
            rows.append(
                {
                    "path": path,
                    "type": _type_text(node, defs),
                    "default": node.get("default"),
                    "has_default": "default" in node,
                    "required": name in required,
                    "description": node.get("description") or help_.get(path, ""),
                }
            )
            for suffix, child in _children(node, defs):
                walk(child, f"{path}{suffix}.")

    walk(schema, "")
    return rows


def _fields_table(rows: list[dict[str, Any]]) -> str:
    out = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for r in rows:
        if r["required"]:
            default = "**required**"
        elif r["has_default"] and r["default"] not in (None, [], {}):
            default = f"`{json.dumps(r['default'])}`"
        else:
            default = ""
        out.append(f"| `{r['path']}` | {r['type']} | {default} | {_cell(r['description'])} |")
    return "\n".join(out)


def _schema_page(kind: str, title: str, intro: str) -> str:
    from tideflow.compile.schema import cluster_schema, pipeline_schema

    schema = pipeline_schema() if kind == "pipeline" else cluster_schema()
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in schema_fields(schema, kind):
        top = row["path"].split(".")[0].split("[")[0]
        groups.setdefault(top, []).append(row)
    # Fields with nothing below them share one table; each other gets its own section.
    single = [rows[0] for rows in groups.values() if len(rows) == 1]
    out = [f"# {title}\n", NOTE, intro, "", "## Top level\n", _fields_table(single), ""]
    for top, rows in groups.items():
        if len(rows) > 1:
            out += [f"## `{top}`\n", _fields_table(rows), ""]
    return "\n".join(out)


def pipeline_page() -> str:
    return _schema_page(
        "pipeline",
        "Pipeline file fields",
        "A pipeline file (`kind: Pipeline`) as `tideflow schema` describes it "
        "(also `pipelines/schema.json`). `steps[]` is each item of the list; a step has "
        "exactly one of `data_prep`, `gang_training`, `evaluation`, `promote_checkpoint`. "
        "Any string field, and a number field given as one template, may use "
        '`"{{ params.NAME }}"`; see [templates](templates.md).',
    )


def cluster_page() -> str:
    return _schema_page(
        "cluster",
        "Cluster file fields",
        "A cluster file (`kind: Cluster`) as `tideflow schema --kind cluster` describes it: "
        "the nodes gangs are placed on, and optionally the teams that share them. "
        "`tideflow validate --cluster FILE` checks one.",
    )


# ---- exit codes ---------------------------------------------------------------------


def exit_codes() -> list[tuple[int, str, str]]:
    """(code, who exits with it, meaning): the numbers read from the code's constants."""
    from tideflow.backends.local_supervisor import EXIT_PREEMPTED, EXIT_UNHEALTHY
    from tideflow.config import EXIT_HUNG
    from tideflow.gangs.driver import EXIT_STOPPED
    from tideflow.steps.runner import EXIT_BAD_ENTRYPOINT, EXIT_BAD_OUTPUTS

    constants = {
        "EXIT_BAD_ENTRYPOINT": EXIT_BAD_ENTRYPOINT,
        "EXIT_BAD_OUTPUTS": EXIT_BAD_OUTPUTS,
        "EXIT_PREEMPTED": EXIT_PREEMPTED,
        "EXIT_UNHEALTHY": EXIT_UNHEALTHY,
        "EXIT_HUNG": EXIT_HUNG,
        "EXIT_STOPPED": EXIT_STOPPED,
    }
    return [(constants.get(str(c), c), who, m) for c, who, m in EXIT_CODE_HELP]


def exit_codes_page() -> str:
    out = ["# Exit codes\n", NOTE, "| code | from | meaning |", "|---|---|---|"]
    out += [f"| {c} | {who} | {_cell(m)} |" for c, who, m in sorted(exit_codes())]
    return "\n".join(out) + "\n"


# ---- environment --------------------------------------------------------------------


def settings() -> list[Any]:
    """Every declared TIDEFLOW_* setting, in declaration order."""
    from tideflow.settings_registry import SETTINGS

    return list(SETTINGS)


def environment_page() -> str:
    out = [
        "# Environment variables\n",
        NOTE,
        "Every `TIDEFLOW_*` variable tideflow reads, from its settings registry "
        "(`tideflow.settings_registry`). *Readers*: `cli` a `tideflow` command, `operator` "
        "an Airflow task, `dag` the DAG file as Airflow parses it, `worker` a gang worker, "
        "`broker` the resource broker, `stack` the local stack. A refused value stops the "
        "reader with a message naming the variable and what is accepted (the CLI exits 2).\n",
        "| variable | default (local) | default (kubernetes) | read by | accepted | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for s in settings():
        defaults = s.defaults
        out.append(
            f"| `{s.name}` | {_cell(defaults['local'])} | {_cell(defaults['kubernetes'])} "
            f"| {', '.join(s.readers)} | {_cell(s.accepted)} | {_cell(s.help)} |"
        )
    return "\n".join(out) + "\n"


def changelog_page() -> str:
    """The repository's CHANGELOG.md, so the site carries the same one."""
    return (REPO / "CHANGELOG.md").read_text()


# ---- command output in pages --------------------------------------------------------


def command_output(args: str) -> str:
    """`tideflow ARGS` run in-process from the repository root, as a console block."""
    import os

    from tideflow.cli import main

    printed = io.StringIO()  # one buffer: stdout and stderr in the order printed
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            code = main(shlex.split(args))
    finally:
        os.chdir(cwd)
    text = printed.getvalue().rstrip()
    tail = f"\n$ echo $?\n{code}" if code else ""
    return f"```console\n$ tideflow {args}\n{text}{tail}\n```"


# ---- mkdocs hooks -------------------------------------------------------------------


def on_files(files: Any, config: Any) -> Any:
    import logging

    from mkdocs.structure.files import File

    for uri, maker in GENERATED.items():
        try:
            content = globals()[maker]()
        except ImportError as exc:  # a strict build fails on the warning
            logging.getLogger("mkdocs.hooks.reference").warning("%s: %s", uri, exc)
            content = f"# {uri}\n\nNot generated: {exc}\n"
        files.append(File.generated(config, uri, content=content))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return OUTPUT_MARK.sub(lambda m: command_output(m.group(1)), markdown)
