"""``tideflow validate`` and ``tideflow schema``: check pipeline and cluster files, and
print the JSON Schema editors check them with."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tideflow.cli.context import cluster_inventory
from tideflow.config import Settings
from tideflow.inventory import Inventory, load_cluster
from tideflow.spec import SpecError, find_pipelines, load_pipeline
from tideflow.spec.loader import CLUSTER_KIND, display_path, document_kind
from tideflow.steps.validation import CLUSTER_TARGETS, deeper_checks


def cmd_validate(args: argparse.Namespace) -> int:
    if not args.paths and not args.cluster:
        print(
            "tideflow validate: name pipeline files or directories, or --cluster FILE",
            file=sys.stderr,
        )
        return 2
    inventory = cluster_inventory(args.cluster)  # a broken cluster file: SpecError, exit 1
    if not args.paths:  # the cluster file alone, as a platform team's CI lints it
        print(f"cluster file {display_path(Path(args.cluster))} valid")
        return 0
    files: list[Path] = []
    for raw in args.paths:
        path = Path(raw)
        found = find_pipelines(path) if path.is_dir() else [path]
        if path.is_dir() and not found:
            print(f"{raw}: no pipeline files (*.yaml, *.yml) found", file=sys.stderr)
            return 1
        files.extend(found)
    clusters = [file for file in files if document_kind(file) == CLUSTER_KIND]
    failed = sum(not _valid(file, inventory, args, cluster=file in clusters) for file in files)
    kinds = f"file(s) valid ({len(files) - len(clusters)} pipeline, {len(clusters)} cluster)"
    what = kinds if clusters else "pipeline file(s) valid"
    print(
        f"{len(files) - failed} of {len(files)} {what}", file=sys.stderr if failed else sys.stdout
    )
    return 1 if failed else 0


def _valid(
    file: Path, inventory: Inventory | None, args: argparse.Namespace, *, cluster: bool
) -> bool:
    """Validate one file as what it is; print its problems (and warnings)."""
    settings = Settings.from_env()
    try:
        if cluster:
            load_cluster(file)
            return True
        spec = load_pipeline(file, inventory, settings.checkpoint_roots_for)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return False
    target = args.target or settings.backend
    errors, warnings = deeper_checks(spec, file, imports=args.imports, target=target)
    for warning in warnings:
        print(warning, file=sys.stderr)
    if errors:
        print(SpecError(display_path(file), errors), file=sys.stderr)
    return not errors


def cmd_schema(args: argparse.Namespace) -> int:
    from tideflow.compile.schema import cluster_schema, pipeline_schema, render

    text = render(pipeline_schema() if args.kind == "pipeline" else cluster_schema())
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def add_parsers(sub: Any) -> None:
    """The ``validate`` and ``schema`` commands, in that order."""
    _add_validate(sub)
    _add_schema(sub)


def _add_validate(sub: Any) -> None:
    validate = sub.add_parser(
        "validate",
        help="check pipeline and cluster files; exit 1 on any error",
        description="Validate pipeline files or directories of them, and the cluster files "
        "(kind: Cluster) among them; with --cluster and no PATH, just that cluster file. "
        "Every problem is reported as file:line:col. Module entry points (module:function, "
        "the promotion's builder too) must import here with the pipeline's code (code.path); "
        "for a cluster target, paths of this machine the steps would carry into pods are "
        "warned about.",
    )
    validate.add_argument("paths", nargs="*", metavar="PATH")
    validate.add_argument(
        "--cluster",
        help="cluster file for the gang-fit check, or to validate alone (no PATH) "
        "(default for the check: $TIDEFLOW_CLUSTER_FILE)",
    )
    validate.add_argument(
        "--target",
        choices=["local", *CLUSTER_TARGETS],
        help="where the pipeline runs: this machine, a Kubernetes cluster (Airflow) or Argo; "
        "a cluster target warns about local paths carried into pods "
        "(default: $TIDEFLOW_BACKEND, local)",
    )
    validate.add_argument(
        "--no-imports",
        dest="imports",
        action="store_false",
        help="do not import the module entry points (no check that they import here)",
    )
    validate.set_defaults(func=cmd_validate)


def _add_schema(sub: Any) -> None:
    schema = sub.add_parser(
        "schema",
        help="print the JSON Schema of pipeline files",
        description="Print the JSON Schema (for yaml-language-server).",
    )
    schema.add_argument("--kind", choices=["pipeline", "cluster"], default="pipeline")
    schema.add_argument("-o", "--output", help="write to this file instead of stdout")
    schema.set_defaults(func=cmd_schema)
