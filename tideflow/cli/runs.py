"""``tideflow run``: one run of a pipeline's DAG in this process, through Airflow."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from tideflow.config import Settings
from tideflow.spec import load_pipeline
from tideflow.spec.params import parse_param_overrides


def cmd_run(args: argparse.Namespace) -> int:
    spec = load_pipeline(args.pipeline)
    conf = parse_param_overrides(spec, args.param)
    from tideflow.dag.local_run import run_interruptibly

    settings = Settings.from_env()
    if not settings.mlflow_tracking_uri:
        # No server configured: track, and register models, in a local SQLite file.
        uri = f"sqlite:///{settings.home / 'mlflow.db'}"
        os.environ["MLFLOW_TRACKING_URI"] = uri
        print(f"tideflow: MLFLOW_TRACKING_URI is not set; tracking in {uri}", file=sys.stderr)
    home = Path(args.airflow_home) if args.airflow_home else settings.home / "airflow-run"
    return run_interruptibly(Path(args.pipeline), conf, home)


def add_parsers(sub: Any) -> None:
    """The ``run`` command."""
    run = sub.add_parser(
        "run",
        help="run a pipeline once through Airflow's dag.test()",
        description="Run the pipeline's DAG once in this process against a "
        "private local Airflow home (no scheduler). Exit code 0 only if the "
        "run succeeded.",
    )
    run.add_argument("pipeline")
    run.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a pipeline param (repeatable)",
    )
    run.add_argument(
        "--airflow-home", help="Airflow home to use (default: $TIDEFLOW_HOME/airflow-run)"
    )
    run.set_defaults(func=cmd_run)
