"""``tideflow`` command line: validate, schema, plan, compile, run, pools, broker.

Errors in user input are printed as ``file:line:col: field: problem; accepted``
and never as a Python traceback. Exit codes: 0 success, 1 invalid input or a
failed pipeline run, 2 usage (argparse) and configuration errors (``ConfigError``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from tideflow import __version__
from tideflow.compile.dag_plan import compile_dag_plan, topological_order
from tideflow.compile.gang_plan import GangStepPlan
from tideflow.compile.templates import exact_param, has_template
from tideflow.config import ConfigError, Settings
from tideflow.gangs.priority import gang_priority
from tideflow.inventory import Inventory, cluster_setting, detect_local, load_cluster
from tideflow.spec import PipelineSpec, SpecError, find_pipelines, load_pipeline
from tideflow.spec.fields import format_duration
from tideflow.spec.loader import CLUSTER_KIND, display_path, document_kind
from tideflow.spec.params import (
    ParamValueError,
    literal,
    param_summary,
    parse_param_overrides,
    run_params,
)
from tideflow.steps.validation import CLUSTER_TARGETS, deeper_checks


def _settings() -> Settings:
    """The platform settings, the cluster file they name loaded and checked: one they
    cannot use is a ``ConfigError`` (exit 2) naming the setting, before any state opens."""
    settings = Settings.from_env()
    if settings.cluster_file is not None:
        cluster_setting(settings.cluster_file)
    return settings


def _inventory(path: str | None) -> Inventory | None:
    if path:  # a file named on the command line: its problems are the file's (exit 1)
        return load_cluster(path)
    settings = Settings.from_env()
    return cluster_setting(settings.cluster_file) if settings.cluster_file else None


def cmd_validate(args: argparse.Namespace) -> int:
    if not args.paths and not args.cluster:
        print(
            "tideflow validate: name pipeline files or directories, or --cluster FILE",
            file=sys.stderr,
        )
        return 2
    inventory = _inventory(args.cluster)  # a broken cluster file: SpecError, exit 1
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


def _at_default(value: Any, spec: PipelineSpec) -> tuple[str, Any]:
    """A field as a run gets it by default, and that value (None when only a run knows it).

    A field that is one ``{{ params.NAME }}`` shows the param's default and where it
    comes from, ``2 (params.workers)``; another template is rendered when the run starts.
    """
    if not has_template(value):
        return str(value), value
    name = exact_param(value)
    if name is not None and name in spec.params:
        default = spec.params[name].default
        return f"{literal(default)} (params.{name})", default
    return f"{value} (rendered when the run starts)", None


def _gang_summary(gang: GangStepPlan, spec: PipelineSpec, inventory: Inventory | None) -> str:
    label = gang.device_class + (f" {gang.device_model}" if gang.device_model else "")
    workers, workers_value = _at_default(gang.workers, spec)
    per, per_value = _at_default(gang.devices_per_worker, spec)
    text = f"workers {workers}"
    if gang.min_workers is not None:
        text += f", min_workers {_at_default(gang.min_workers, spec)[0]}"
    text += f", {per} {label} each"
    if inventory is not None and _is_int(workers_value) and _is_int(per_value):
        room = inventory.max_gang_workers(gang.device_class, gang.device_model, per_value)
        text += f"; cluster '{inventory.name}' has room for {room} such worker(s)"
    return text


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def cmd_plan(args: argparse.Namespace) -> int:
    inventory = _inventory(args.cluster)
    spec = load_pipeline(args.pipeline, inventory)
    plan = compile_dag_plan(spec)
    if args.json:
        print(json.dumps(plan.as_dict(), indent=2, sort_keys=True, default=str))
        return 0
    print(f"pipeline {plan.dag_id} (team {plan.team}), schedule: {plan.schedule or 'manual'}")
    if spec.code is not None:
        where = f"package {spec.code.package}" if spec.code.package else f"{plan.code_path}"
        inside = f" (in the image: {spec.code.image_path})" if spec.code.image_path else ""
        print(f"code: {where}{inside}")
    params = run_params(spec)  # the ones a run may set: priority_class too, where named
    if params:
        print("params:")
        for name, param in params.items():
            print(f"  {name}: {param_summary(param)}")
    print("steps, in order:")
    for index, task in enumerate(topological_order(plan), start=1):
        needs = ", ".join(task.upstream) or "-"
        timeout = format_duration(task.timeout_seconds) if task.timeout_seconds else "none"
        print(f"  {index}. {task.task_id} [{task.kind}] needs: {needs}")
        print(
            f"     pool {task.pool} ({task.pool_slots} slot(s)), retries {task.retries}, "
            f"timeout {timeout}"
        )
        config = task.config
        if task.kind == "data_prep":
            res = config["resources"]
            print(f"     resources: cpu {res['cpu']}, memory {res['memory']}")
        elif task.gang is not None:
            gang = task.gang
            print(f"     gang: {_gang_summary(gang, spec, inventory)}")
            print(f"     priority: {gang_priority(plan, gang, inventory)}")
            asked = [f"{k} {v}" for k, v in (("cpu", gang.cpu), ("memory", gang.memory)) if v]
            if asked:
                print(f"     per worker: {', '.join(asked)}")
        elif task.kind == "evaluation":
            print(f"     devices (preference): {', '.join(config['devices'])}")
        elif task.kind == "promote_checkpoint":
            print(f"     model {config['model']} -> alias {config['alias']}")
        if task.image:
            print(f"     image (cluster): {task.image}")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    """Airflow: the DAG summary (as ``plan``). Argo: a WorkflowTemplate, written or printed.
    Kueue, Volcano: a cluster file's teams as the engine's queues."""
    if args.target in ("kueue", "volcano"):
        return _compile_queues(args)
    if args.target == "airflow":
        if args.output:
            print("tideflow compile: -o applies to --target argo", file=sys.stderr)
            return 2
        return cmd_plan(
            argparse.Namespace(pipeline=args.pipeline, cluster=args.cluster, json=False)
        )
    from tideflow.kube.settings import kube_settings_from_env

    try:
        settings = kube_settings_from_env()
    except ValueError as exc:
        print(f"tideflow compile: {exc}", file=sys.stderr)
        return 2
    # hera is an edge dependency (the platform extra): imported only for this command.
    from tideflow.argo import compile_pipeline, render_cron, write

    inventory = _inventory(args.cluster)
    pipeline = Path(args.pipeline)
    spec = load_pipeline(pipeline, inventory)
    _, warnings = deeper_checks(spec, pipeline, imports=False, target="argo")
    for warning in warnings:
        print(warning, file=sys.stderr)
    if args.output:
        for target in write(args.pipeline, args.output, settings=settings, inventory=inventory):
            print(f"wrote {target}")
    else:
        plan, text = compile_pipeline(args.pipeline, settings=settings, inventory=inventory)
        cron = render_cron(plan, args.pipeline)
        sys.stdout.write(text if cron is None else f"{text}---\n{cron}")
    return 0


def _compile_queues(args: argparse.Namespace) -> int:
    """The cluster file's teams as Kueue or Volcano objects; each rule the engine cannot
    express is a warning, on stderr and as a comment on top of the output."""
    from tideflow.compile.team_queues import QueueCompileError
    from tideflow.inventory import ClusterSpec
    from tideflow.spec.loader import load_model

    spec = load_model(args.pipeline, ClusterSpec)
    try:
        if args.target == "kueue":
            from tideflow.compile.kueue_queues import compile_kueue

            text, warnings = compile_kueue(spec, source=args.pipeline)
        else:
            from tideflow.compile.volcano_queues import compile_volcano

            text, warnings = compile_volcano(spec, source=args.pipeline)
    except QueueCompileError as exc:
        print(f"tideflow compile: {exc}", file=sys.stderr)
        return 2
    for warning in warnings:
        print(f"warning: {args.target}: {warning}", file=sys.stderr)
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


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


def cmd_gangs(args: argparse.Namespace) -> int:
    from tideflow.backends.local import LocalBackend
    from tideflow.gangs import open_ledger
    from tideflow.gangs.control import gang_rows, stop_gang

    settings = _settings()
    ledger = open_ledger(settings.ledger_path, settings.cluster)
    backend = LocalBackend(settings.gangs_dir)
    if args.action == "cancel":
        if not args.gang_id:
            print(
                "tideflow gangs cancel: name the gang (tideflow gangs lists them)", file=sys.stderr
            )
            return 2
        print(stop_gang(args.gang_id, ledger, backend))
        return 0
    rows = gang_rows(ledger, backend)
    if args.json:
        from dataclasses import asdict

        print(json.dumps([asdict(row) for row in rows], indent=2))
        return 0
    print(f"{'GANG':40} {'STATE':10} {'TEAM':12} {'DEVICES':>7} {'AGE':>8}  HOLDER")
    for row in rows:
        print(
            f"{row.gang_id:40} {row.state:10} {row.team:12} {row.devices:>7} "
            f"{row.age_s:>7.0f}s  {row.holder}"
        )
    return 0


def cmd_usage(args: argparse.Namespace) -> int:
    import csv
    import time

    from tideflow.scheduling import accounting

    now = time.time()
    try:
        until = accounting.parse_when(args.until, now, "--until") if args.until else now
        # The budget month is the calendar month the window ends in (this one by default).
        month_start, _ = accounting.month_window(until)
        since = accounting.parse_when(args.since, now, "--since") if args.since else month_start
    except ValueError as exc:
        print(f"tideflow usage: {exc}", file=sys.stderr)
        return 2
    if since >= until:
        print(
            f"tideflow usage: --since ({_utc(since)}) must be before --until ({_utc(until)})",
            file=sys.stderr,
        )
        return 2
    settings = _settings()
    totals: list[accounting.UsageTotal] = []
    spent: list[accounting.BudgetUse] = []
    if settings.ledger_path.exists():
        from tideflow.gangs import open_ledger

        ledger = open_ledger(settings.ledger_path, settings.cluster)
        totals = accounting.usage_totals(ledger.usage_spans(since, until), args.by, until=until)
        if args.by == "team":
            spent = accounting.model_budgets(
                ledger.inventory.teams, ledger.usage_spans(month_start, until)
            )
    else:
        print(
            f"tideflow usage: no lease ledger at {settings.ledger_path} (nothing leased yet)",
            file=sys.stderr,
        )
    columns = accounting.report_columns(args.by)
    rows = accounting.report_rows(totals, args.by, spent)
    if args.format == "json":
        print(json.dumps(rows, indent=2))
    elif args.format == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([_csv_cell(row[c]) for c in columns] for row in rows)
    else:
        print(f"device-hours {_utc(since)} .. {_utc(until)} UTC, by {args.by}")
        _print_usage_table(columns, rows)
    return 0


def _utc(at: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _table_cell(column: str, value: Any) -> str:
    if value is None:
        return "-"
    if column == "budget_used":
        return f"{value:.0%}"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _print_usage_table(columns: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    text = {"team", "pipeline", "run", "device_class"}  # left-aligned; numbers right
    heads = [
        c.replace("_device_hours", "_hours").replace("_hours", "-h").replace("_", " ").upper()
        for c in columns
    ]
    shown = [heads, *([_table_cell(column, row[column]) for column in columns] for row in rows)]
    widths = [max(len(r[i]) for r in shown) for i in range(len(columns))]
    for cells in shown:
        print(
            "  ".join(
                cell.ljust(width) if column in text else cell.rjust(width)
                for cell, width, column in zip(cells, widths, columns, strict=True)
            ).rstrip()
        )


def cmd_pools(args: argparse.Namespace) -> int:
    from tideflow.compile.pools import pool_sizes

    inventory = _inventory(args.cluster) or detect_local()
    for pool, size in pool_sizes(inventory).items():
        print(f"{pool}\t{size}")
    return 0


def cmd_broker_simulate(args: argparse.Namespace) -> int:
    import json

    from tideflow.broker import (
        LoadSourceError,
        SimulationConfig,
        SyntheticLoad,
        TraceLoad,
        load_jobs,
        simulate,
        synthetic_jobs,
    )

    try:
        load: TraceLoad | SyntheticLoad
        if args.trace == "synthetic":
            load = SyntheticLoad(mean_rps=args.synthetic_mean_rps, seed=args.seed)
            start, end = 0.0, args.days * 86400.0
        else:
            load = TraceLoad(args.trace)
            start, end = load.start_s, load.end_s
        horizon = end - start
        config = SimulationConfig(
            policy=args.policy,
            total_gpus=args.gpus,
            node_gpus=args.node_gpus,
            per_gpu_rps=args.per_gpu_rps,
        )
        config.static_gpus()  # validates the policy string
        jobs = (
            synthetic_jobs(seed=args.seed, total_gpus=args.gpus, horizon_s=horizon)
            if args.jobs == "synthetic"
            else load_jobs(args.jobs)
        )
        result = simulate(load, jobs, config, start_s=start, end_s=end)
    except (LoadSourceError, ValueError, OSError) as exc:
        print(f"tideflow broker simulate: {exc}", file=sys.stderr)
        return 2
    if args.html:
        _write_timeline(result, config, Path(args.html), args.html_day)
    if args.json:
        print(json.dumps(result.to_json(timeline=args.timeline), indent=2))
    else:
        for key, value in result.metrics.items():
            print(f"{key:32s} {value}")
    return 0


def cmd_broker_run(args: argparse.Namespace) -> int:
    import time as clock

    from tideflow.broker.service import open_local, rebalance_step, step_line
    from tideflow.broker.settings import BrokerSettings
    from tideflow.config import Settings

    settings = BrokerSettings.from_env()  # a setting it cannot use: ConfigError, exit 2
    if settings is None:
        print(
            "tideflow broker run: set TIDEFLOW_BROKER_LOAD (trace:PATH.csv, "
            "prometheus:URL|QUERY or synthetic:MEAN_RPS) and TIDEFLOW_BROKER_PER_GPU_RPS",
            file=sys.stderr,
        )
        return 2
    paths = Settings.from_env()
    ledger, journal = paths.ledger_path, paths.broker_journal_path
    load, actuator, config, book = (
        open_local(settings, ledger, journal, paths.cluster)
        if args.backend == "local"
        else _kubernetes_broker(settings, journal)
    )
    steps = 0
    while True:
        step = rebalance_step(load, actuator, config, book, act=not args.dry_run)
        print(step_line(step, args.dry_run), flush=True)
        steps += 1
        if args.once or (args.steps and steps >= args.steps):
            return 0
        clock.sleep(args.interval)


def _write_timeline(result: Any, config: Any, path: Path, day: int) -> None:
    """One simulated day drawn with the tideflow page's timeline, as a standalone page."""
    import math
    from html import escape

    from tideflow.ui import BrokerPoint, render_timeline

    start = day * 86400.0
    points = [
        BrokerPoint(
            w.start_s,
            config.total_gpus,
            w.inference_gpus,
            w.needed,
            math.ceil(w.forecast_upper / config.per_gpu_rps * (1 + config.headroom))
            if w.forecast_upper
            else None,
            w.preempted,
            w.action,
            w.reason,
        )
        for w in result.windows
        if start <= w.start_s < start + 86400
    ]
    title = f"Simulated day {day} - policy {config.policy}, {config.per_gpu_rps:g} rps per GPU"
    path.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:16px;color:#1f2933}"
        ".legend{font-size:12px;color:#52606d}</style></head><body>"
        f"<h3>{escape(title)}</h3>{render_timeline(points, start, start + 86400)}</body></html>"
    )


def _kubernetes_broker(settings: Any, journal: Path) -> tuple[Any, Any, Any, Any]:
    from tideflow.broker.service import open_kubernetes
    from tideflow.kube.client import connect

    return open_kubernetes(settings, journal, connect())


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


def _add_compile(sub: Any) -> None:
    compile_ = sub.add_parser(
        "compile",
        help="compile a pipeline for an engine: an Argo WorkflowTemplate, or the Airflow DAG",
        description="Compile a pipeline. --target argo writes an Argo WorkflowTemplate "
        "(one DAG task per step; the gang step runs the gang driver, which submits the gang "
        "to the cluster's gang scheduler and follows it) to "
        "DIR/<pipeline>.workflowtemplate.yaml, and for a scheduled pipeline a CronWorkflow "
        "that submits it to DIR/<pipeline>.cronworkflow.yaml (without -o: both printed, "
        "as one YAML stream); namespace, image, "
        "store Secret and MLflow address come from TIDEFLOW_K8S_* and TIDEFLOW_ARTIFACT_ROOT. "
        "--target airflow prints the DAG summary, as `tideflow plan` does. "
        "--target kueue|volcano takes a cluster file instead and prints its teams as the "
        "engine's queues (Kueue: WorkloadPriorityClasses, ResourceFlavors, a Cohort, "
        "ClusterQueues, LocalQueues; Volcano: PriorityClasses and Queues) to stdout or -o "
        "FILE; each rule the engine cannot express is a warning on stderr and a comment on "
        "top of the output.",
    )
    compile_.add_argument("pipeline", help="pipeline file (argo, airflow) or cluster file")
    compile_.add_argument(
        "--target", choices=["argo", "airflow", "kueue", "volcano"], required=True
    )
    compile_.add_argument(
        "-o",
        "--output",
        metavar="DIR|FILE",
        help="directory to write into (argo); file to write (kueue, volcano)",
    )
    compile_.add_argument(
        "--cluster",
        help="cluster inventory file: an evaluation runs on the first of its devices the "
        "cluster has (default: $TIDEFLOW_CLUSTER_FILE)",
    )
    compile_.set_defaults(func=cmd_compile)


def _add_gangs_parser(sub: Any) -> None:
    gangs = sub.add_parser(
        "gangs",
        help="list the gangs on this machine's ledger and backend, or cancel one",
        description="Every gang holding devices, waiting for them or running (state, team, "
        "devices, age, holder); 'cancel GANG' stops its workers and frees its lease.",
    )
    gangs.add_argument("action", nargs="?", choices=("list", "cancel"), default="list")
    gangs.add_argument("gang_id", nargs="?", help="the gang to cancel (PIPELINE/RUN/STEP)")
    gangs.add_argument("--json", action="store_true", help="print the list as JSON")
    gangs.set_defaults(func=cmd_gangs)


USAGE_HELP = """\
Device-hours from the lease ledger (under TIDEFLOW_HOME; teams, quotas and budgets
from the cluster file, TIDEFLOW_CLUSTER_FILE), per group and device class, for the
leases that overlap the window (the part inside it).

columns (csv and json; the table shows the same):
  team | pipeline | run   the group: a team; a pipeline; a DAG run, PIPELINE/RUN
                         (the broker's reservations are 'broker/inference'; a lease
                         not taken by a pipeline is listed under its own id)
  team                   the group's team (by pipeline and by run)
  device_class           cpu, gpu or npu
  device_hours           devices x hours held inside the window
  own_hours              of device_hours, within the team's nominal quota
  borrowed_hours         of device_hours, beyond it (shared pool or a lender)
  lost_hours             of device_hours, work a forced stop threw away (since the
                         gang's last checkpoint)
  preempted              leases the ledger stopped (preempted or forced) in the window
  gangs                  distinct gangs (PIPELINE/RUN/STEP) with leases in the window
by team, also:
  budget_device_hours    the team's budget_device_hours for the class, per month
  month_device_hours     its device-hours this calendar month (UTC; the month the
                         window ends in), whatever --since says
  budget_used            month_device_hours / budget_device_hours (1.0 = all)
Empty budget fields: the team has no budget for the class.
"""


def _add_usage_parser(sub: Any) -> None:
    usage = sub.add_parser(
        "usage",
        help="device-hours per team, pipeline or DAG run: own quota, borrowed, lost",
        description=USAGE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    when = (
        "an ISO date or date-time (2026-11-01, 2026-11-01T08:00; UTC unless it names an "
        "offset) or a duration back from now (90m, 24h, 7d, 2w)"
    )
    usage.add_argument(
        "--since", help=f"window start: {when} (default: the start of this month, UTC)"
    )
    usage.add_argument("--until", help=f"window end: {when} (default: now)")
    usage.add_argument(
        "--by", choices=("team", "pipeline", "run"), default="team", help="group by (default team)"
    )
    usage.add_argument(
        "--format", choices=("table", "csv", "json"), default="table", help="(default table)"
    )
    usage.set_defaults(func=cmd_usage)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tideflow",
        description="Declarative ML training pipelines: YAML -> Airflow DAGs and Argo Workflows.",
    )
    parser.add_argument("--version", action="version", version=f"tideflow {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_validate(sub)

    schema = sub.add_parser(
        "schema",
        help="print the JSON Schema of pipeline files",
        description="Print the JSON Schema (for yaml-language-server).",
    )
    schema.add_argument("--kind", choices=["pipeline", "cluster"], default="pipeline")
    schema.add_argument("-o", "--output", help="write to this file instead of stdout")
    schema.set_defaults(func=cmd_schema)

    plan = sub.add_parser(
        "plan",
        help="show steps, order, placement and resources",
        description="Show what the pipeline compiles to.",
    )
    plan.add_argument("pipeline")
    plan.add_argument("--cluster", help="cluster inventory file (default: $TIDEFLOW_CLUSTER_FILE)")
    plan.add_argument("--json", action="store_true", help="print the compiled plan as JSON")
    plan.set_defaults(func=cmd_plan)

    _add_compile(sub)

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

    _add_gangs_parser(sub)
    _add_usage_parser(sub)

    pools = sub.add_parser(
        "pools",
        help="print Airflow pool sizes for a cluster inventory",
        description="Pool sizes (tideflow-cpu/gpu/npu) from the inventory.",
    )
    pools.add_argument("--cluster", help="cluster inventory file (default: this machine)")
    pools.set_defaults(func=cmd_pools)

    broker = sub.add_parser(
        "broker",
        help="the GPU broker between inference and training",
        description="The resource broker: shifts GPUs between inference and training by load.",
    )
    broker_sub = broker.add_subparsers(dest="broker_command", required=True, metavar="COMMAND")
    sim = broker_sub.add_parser(
        "simulate",
        help="replay a load trace against a training backlog under a policy",
        description="Replay an inference load trace in simulated time against a backlog "
        "of training gangs and print what the policy achieved. The policy sees only "
        "the past.",
    )
    sim.add_argument(
        "--trace", required=True, help="CSV with start_s,rate_rps, or 'synthetic' (seeded)"
    )
    sim.add_argument("--gpus", type=int, default=200, help="GPUs in the cluster (default 200)")
    sim.add_argument("--node-gpus", type=int, default=8, help="GPUs per node (default 8)")
    sim.add_argument(
        "--per-gpu-rps",
        type=float,
        required=True,
        help="requests/s one inference GPU serves within its latency SLO",
    )
    sim.add_argument(
        "--policy",
        default="tidal",
        help="'tidal' (the broker), 'static:N' (N inference GPUs, whole nodes) or 'cron:H' "
        "(an hour-of-day schedule with headroom H)",
    )
    sim.add_argument(
        "--jobs", default="synthetic", help="'synthetic' (seeded) or a CSV of training jobs"
    )
    sim.add_argument("--seed", type=int, default=0, help="seed of the synthetic streams")
    sim.add_argument("--days", type=float, default=14, help="length of a synthetic trace")
    sim.add_argument("--synthetic-mean-rps", type=float, default=2000.0)
    sim.add_argument("--json", action="store_true", help="print the result as JSON")
    sim.add_argument("--timeline", action="store_true", help="with --json: every window too")
    sim.add_argument("--html", help="also draw one simulated day's timeline into this file")
    sim.add_argument("--html-day", type=int, default=7, help="which day to draw (default 7)")
    sim.set_defaults(func=cmd_broker_simulate)

    run_broker = broker_sub.add_parser(
        "run",
        help="run the broker as a service, on the local lease ledger or a Kubernetes cluster",
        description="Observe, decide, act and record every --interval seconds, against the "
        "lease ledger under TIDEFLOW_HOME or a Kubernetes cluster (settings from "
        "TIDEFLOW_BROKER_* and TIDEFLOW_K8S_*). The same policy and code as the "
        "tideflow_broker DAG.",
    )
    run_broker.add_argument("--interval", type=float, default=60.0, help="seconds between steps")
    run_broker.add_argument(
        "--backend",
        choices=["local", "kubernetes"],
        default="local",
        help="act on the local lease ledger, or on a cluster (TIDEFLOW_K8S_* settings)",
    )
    run_broker.add_argument("--once", action="store_true", help="take one step and exit")
    run_broker.add_argument("--steps", type=int, default=0, help="stop after this many steps")
    run_broker.add_argument(
        "--dry-run", action="store_true", help="decide and record, but move nothing"
    )
    run_broker.set_defaults(func=cmd_broker_run)
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


if __name__ == "__main__":
    sys.exit(main())
