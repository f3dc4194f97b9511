"""What the standalone executor (``tideflow.steps.standalone``) reads and writes.

Its command line, shared with the Argo gang step's driver (``tideflow.gangs.driver``);
the values the workflow engine fills in, each a ``--set PATH:TYPE=VALUE`` read as
the type the compiler recorded; and its outputs, one file per name, where Argo
reads them as output parameters. The names of those outputs are here too: the
Argo compiler declares them.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from tideflow.steps.evaluation import CHECKPOINT_KEYS, SELECTION_OUTPUT

KINDS = ("data_prep", "evaluation", "promote_checkpoint", "pipeline_end")
EVALUATION_OUTPUTS = ("metrics", "device", *CHECKPOINT_KEYS, SELECTION_OUTPUT)
PROMOTION_OUTPUTS = ("decision", "version", "alias", "previous", "reason", "model_uri")
# The Argo gang step's (tideflow.gangs.driver): where the gang kept its checkpoints, its newest.
GANG_OUTPUTS = ("checkpoint_store", "checkpoint", "checkpoint_step")
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def read_value(text: str, kind: str) -> Any:
    """``text`` as the type the compiler recorded for it."""
    if kind == "str":
        return text
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    if kind == "bool":
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        raise ValueError(f"{text!r} is not a boolean (true or false)")
    if kind == "json":
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    raise ValueError(f"unknown value type {kind!r}: accepted: str, int, float, bool, json")


def parse_assignment(item: str) -> tuple[list[str], Any]:
    """``PATH:TYPE=VALUE`` -> (path segments, typed value)."""
    target, equals, text = item.partition("=")
    path, colon, kind = target.rpartition(":")
    if not equals or not colon or not path:
        raise ValueError(f"{item!r} is not PATH:TYPE=VALUE")
    return [unquote(part) for part in path.split("/")], read_value(text, kind)


def assign(doc: Any, path: list[str], value: Any) -> None:
    for part in path[:-1]:
        doc = doc[int(part)] if isinstance(doc, list) else doc.setdefault(part, {})
    last = path[-1]
    if isinstance(doc, list):
        doc[int(last)] = value
    else:
        doc[last] = value


def output_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list, bool)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def write_outputs(directory: Path, outputs: Mapping[str, object], names: tuple[str, ...]) -> None:
    """One file per name; a name with no value gets an empty file, so Argo finds them all."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_text(output_text(outputs.get(name)), encoding="utf-8")


def build_parser(
    kinds: tuple[str, ...] = KINDS, prog: str = "python -m tideflow.steps.standalone"
) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run one pipeline step outside Airflow (an Argo workflow's step container).",
    )
    parser.add_argument("kind", choices=kinds)
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--team", required=True)
    parser.add_argument("--step", required=True)
    parser.add_argument("--run-id", required=True, help="the workflow run (its name)")
    parser.add_argument("--attempt", type=int, default=0, help="0 for the first try")
    parser.add_argument("--config", required=True, help="the step's configuration as JSON")
    parser.add_argument("--set", action="append", default=[], metavar="PATH:TYPE=VALUE")
    parser.add_argument("--param", action="append", default=[], metavar="NAME:TYPE=VALUE")
    parser.add_argument("--device", help="evaluation: where the pod was placed (cpu, gpu-spare...)")
    parser.add_argument("--checkpoint-store", help="the gang step's checkpoint store URI")
    parser.add_argument("--checkpoint-step", help="promotion: the evaluated checkpoint's step")
    parser.add_argument("--training-step", help="promotion: the gang step's name (lineage)")
    parser.add_argument("--metrics", help="promotion: the evaluation's metrics as JSON")
    parser.add_argument(
        "--checkpoint-selection",
        help="promotion: how the evaluation chose its checkpoint (its output, JSON)",
    )
    parser.add_argument("--outputs", required=True, type=Path, help="directory for output files")
    return parser


def read_step(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The step's configuration with every ``--set`` filled in, and the run's params.

    ValueError (or KeyError, IndexError, TypeError) for arguments that do not fit.
    """
    config = json.loads(args.config)
    if not isinstance(config, dict):
        raise ValueError("--config is not a JSON object")
    for item in args.set:
        path, value = parse_assignment(item)
        assign(config, path, value)
    params = {}
    for item in args.param:
        (name, *_), value = parse_assignment(item)
        params[name] = value
    return config, params


BAD_ARGUMENTS = (ValueError, KeyError, IndexError, TypeError)
