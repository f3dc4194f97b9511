"""``tideflow broker``: the GPU broker between inference and training, replayed
against a load trace (``simulate``) or run as a service (``run``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tideflow.config import Settings


def cmd_broker_simulate(args: argparse.Namespace) -> int:
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


def add_parsers(sub: Any) -> None:
    """The ``broker`` command and its ``simulate`` and ``run`` sub-commands."""
    broker = sub.add_parser(
        "broker",
        help="the GPU broker between inference and training",
        description="The resource broker: shifts GPUs between inference and training by load.",
    )
    broker_sub = broker.add_subparsers(dest="broker_command", required=True, metavar="COMMAND")
    _add_simulate(broker_sub)
    _add_run(broker_sub)


def _add_simulate(broker_sub: Any) -> None:
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


def _add_run(broker_sub: Any) -> None:
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
