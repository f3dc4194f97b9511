"""``tideflow gangs``, ``tideflow usage`` and ``tideflow pools``: the gangs holding
devices, the device-hours teams used against their quotas and budgets, and the pool
sizes a cluster gives Airflow."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tideflow.cli.context import checked_settings, cluster_inventory
from tideflow.inventory import detect_local


def cmd_gangs(args: argparse.Namespace) -> int:
    from tideflow.backends.local import LocalBackend
    from tideflow.gangs import open_ledger
    from tideflow.gangs.control import gang_rows, stop_gang

    settings = checked_settings()
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
    settings = checked_settings()
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

    inventory = cluster_inventory(args.cluster) or detect_local()
    for pool, size in pool_sizes(inventory).items():
        print(f"{pool}\t{size}")
    return 0


def add_parsers(sub: Any) -> None:
    """The ``gangs``, ``usage`` and ``pools`` commands, in that order."""
    _add_gangs(sub)
    _add_usage(sub)
    _add_pools(sub)


def _add_gangs(sub: Any) -> None:
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


def _add_usage(sub: Any) -> None:
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


def _add_pools(sub: Any) -> None:
    pools = sub.add_parser(
        "pools",
        help="print Airflow pool sizes for a cluster inventory",
        description="Pool sizes (tideflow-cpu/gpu/npu) from the inventory.",
    )
    pools.add_argument("--cluster", help="cluster inventory file (default: this machine)")
    pools.set_defaults(func=cmd_pools)
