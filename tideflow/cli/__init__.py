"""``tideflow`` command line: validate, schema, plan, compile, run, gangs, usage, pools,
broker; each family of commands defines its parsers and handlers in its own module.

Errors in user input are printed as ``file:line:col: field: problem; accepted``
and never as a Python traceback. Exit codes: 0 success, 1 invalid input or a
failed pipeline run, 2 usage (argparse) and configuration errors (``ConfigError``).
"""

from __future__ import annotations

import argparse
import sys

from tideflow import __version__
from tideflow.cli import broker, checks, plans, runs, teams
from tideflow.config import ConfigError
from tideflow.spec import SpecError
from tideflow.spec.params import ParamValueError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tideflow",
        description="Declarative ML training pipelines: YAML -> Airflow DAGs and Argo Workflows.",
    )
    parser.add_argument("--version", action="version", version=f"tideflow {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # In this order: `tideflow --help` and the reference pages list the commands so.
    for commands in (checks, plans, runs, teams, broker):
        commands.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 1
    except ParamValueError as exc:
        print(f"tideflow: {exc}", file=sys.stderr)
        return 1
    except ConfigError as exc:  # a setting, named with its value and what is accepted
        print(f"tideflow {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
