"""``tideflow plan`` and ``tideflow compile``: what a pipeline compiles to, shown as a
summary of its steps or written for an engine (Argo, Airflow; a cluster file's teams
as Kueue or Volcano queues)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tideflow.cli.context import cluster_inventory
from tideflow.compile.dag_plan import compile_dag_plan, topological_order
from tideflow.compile.gang_plan import GangStepPlan
from tideflow.compile.templates import exact_param, has_template
from tideflow.gangs.priority import gang_priority
from tideflow.inventory import Inventory
from tideflow.spec import PipelineSpec, load_pipeline
from tideflow.spec.fields import format_duration
from tideflow.spec.params import literal, param_summary, run_params
from tideflow.steps.validation import deeper_checks


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
    inventory = cluster_inventory(args.cluster)
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

    inventory = cluster_inventory(args.cluster)
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


def add_parsers(sub: Any) -> None:
    """The ``plan`` and ``compile`` commands, in that order."""
    _add_plan(sub)
    _add_compile(sub)


def _add_plan(sub: Any) -> None:
    plan = sub.add_parser(
        "plan",
        help="show steps, order, placement and resources",
        description="Show what the pipeline compiles to.",
    )
    plan.add_argument("pipeline")
    plan.add_argument("--cluster", help="cluster inventory file (default: $TIDEFLOW_CLUSTER_FILE)")
    plan.add_argument("--json", action="store_true", help="print the compiled plan as JSON")
    plan.set_defaults(func=cmd_plan)


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
