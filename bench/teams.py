"""Teams: static quotas versus tideflow's borrowing and preemption, replayed through the ledger.

    nice .venv/bin/python bench/teams.py                      # scenarios 4 and 5, seeds 1-3
    nice .venv/bin/python bench/teams.py --scenario 4 --seeds 1,2,3,4,5 --days 30
    nice .venv/bin/python bench/teams.py --scenario 5 --markdown

Every decision is the real ``LeaseLedger.try_acquire`` on a simulated clock
(``research.scheduling.replay``); both policies replay the same seeded stream
on the users' bank cluster (100 GPUs in 10 nodes of 10; risk 40, marketing 30,
research 30). "static" is the same file with no borrowing rules and no class
that preempts (``replay.static_quotas``).

Scenario 4, a month: risk at 70% of its quota, then 170% over the last five
days (month end); marketing at 20% of its share; research steady at 80%.
Scenario 5: risk's two-week 32-GPU run (hourly checkpoints) holds its GPUs
when an urgent 32-GPU replacement model (16 h of training) arrives on day 3
and must finish within 24 h; the other teams busy. Static has two outcomes:
the urgent model waits ("static-wait"), or the team kills the long run by
hand when it arrives and loses that run's work ("static-kill").

Prints one JSON line per (scenario, seed, policy, team) and per run, then a
table with tideflow/static ratios per seed, and the first wait of the largest
gangs (20 GPUs, two whole nodes: what a reservation is for) per team.
``scheduling.reserve_after`` is the file's default (1800 s) in both policies;
``--reserve-after none`` turns it off. The first line names the commit the
ledger and policy came from.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

# research/ (the references measured here) sits beside bench/ and is not installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from research.scheduling.replay import replay
from research.scheduling.streams import (
    DAY,
    HOUR,
    bank_spec,
    month_end_stream,
    static_quotas,
    urgent_stream,
)

S5_DAYS = 6.0
LARGE = 20  # devices of the largest gangs of the streams (two whole nodes)


def _spec(policy: str, reserve_after: str) -> Any:
    spec = bank_spec() if reserve_after == "declared" else bank_spec(reserve_after=None)
    return spec if policy == "tideflow" else static_quotas(spec)


def _commit() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, check=False
        ).stdout.strip()

    # the ledger and its quota policy: an edit there may change the figures
    policy = tuple(
        f"tideflow/scheduling/{module}.py"
        for module in (
            *("ledger", "state", "snapshot", "admission", "evictions", "journal", "usage"),
            *("quota", "teams", "preemption"),
        )
    )
    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "policy_edited": bool(git("status", "--porcelain", *policy)),
    }


def _p95(values: list[float]) -> float:
    """The replay's percentile: the smallest value with 95% of them at or below it."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def _large(result: Any) -> dict[str, dict[str, float]]:
    """First wait (arrival to first start) of the largest gangs, per team and in all."""
    waits: dict[str, list[float]] = {}
    for outcome in result.outcomes.values():
        if outcome.job.devices == LARGE:
            wait = outcome.first_wait_s / HOUR
            waits.setdefault(outcome.job.team, []).append(wait)
            waits.setdefault("all", []).append(wait)
    return {
        team: {
            "gangs": len(w),
            "mean_h": statistics.fmean(w),
            "p95_h": _p95(w),
            "max_h": max(w),
        }
        for team, w in sorted(waits.items())
    }


def run_one(
    scenario: int, seed: int, policy: str, days: float, reserve_after: str
) -> dict[str, Any]:
    started = time.perf_counter()
    if scenario == 4:
        jobs = month_end_stream(seed, days=days)
        result = replay(_spec(policy, reserve_after), jobs, policy=policy, window_s=days * DAY)
        extra: dict[str, Any] = {}
    else:
        jobs = urgent_stream(seed, days=S5_DAYS)
        urgent = next(j for j in jobs if j.gang_id == "risk-urgent")
        kills = {"risk-long-run": urgent.arrival_s} if policy == "static-kill" else None
        result = replay(
            _spec(policy, reserve_after),
            jobs,
            policy=policy,
            window_s=S5_DAYS * DAY,
            kills=kills,
        )
        done, long_run = result.outcome("risk-urgent"), result.outcome("risk-long-run")
        assert done.finished is not None and long_run.finished is not None
        extra = {
            "urgent_hours": (done.finished - urgent.arrival_s) / HOUR,
            "urgent_deadline_met": done.finished <= (urgent.deadline_s or 0.0),
            "long_run_preemptions": long_run.preemptions,
            "long_run_lost_device_h": long_run.lost_s * long_run.job.devices / HOUR,
            "long_run_lost_h": long_run.lost_s / HOUR,
            "long_run_finish_days": long_run.finished / DAY,
        }
    return {
        "scenario": scenario,
        "seed": seed,
        "policy": policy,
        "jobs": len(result.outcomes),
        "decisions": result.decisions,
        "cluster_use": result.cluster_use,
        "makespan_days": result.makespan_s / DAY,
        "seconds": time.perf_counter() - started,
        "teams": {t: f.as_dict() for t, f in result.teams.items()},
        "large": _large(result),
        **extra,
    }


def _ratio(a: float, b: float) -> str:
    return "-" if b == 0 else f"{a / b:.2f}"


def table(runs: list[dict[str, Any]], markdown: bool) -> str:
    by = {(r["scenario"], r["seed"], r["policy"]): r for r in runs}
    lines: list[str] = []
    sep = " | "
    seeds4 = sorted({r["seed"] for r in runs if r["scenario"] == 4})
    if seeds4:
        head = [
            "seed",
            "team",
            "queue mean h (static / tideflow / ratio)",
            "queue p95 h (s / t / ratio)",
            "quota use (s / t)",
            "cluster share (s / t)",
            "own / borrowed dev-h (t)",
            "preempted (forced)",
            "lost dev-h",
        ]
        lines += ["Scenario 4: month-end burst for risk, marketing at 20%", ""]
        lines.append(("| " if markdown else "") + sep.join(head) + (" |" if markdown else ""))
        if markdown:
            lines.append("|" + "---|" * len(head))
        for seed in seeds4:
            s, t = by[(4, seed, "static")], by[(4, seed, "tideflow")]
            for team in sorted(s["teams"]):
                a, b = s["teams"][team], t["teams"][team]
                row = [
                    str(seed),
                    team,
                    f"{a['queue_mean_h']:.1f} / {b['queue_mean_h']:.1f} / "
                    f"{_ratio(b['queue_mean_h'], a['queue_mean_h'])}",
                    f"{a['queue_p95_h']:.1f} / {b['queue_p95_h']:.1f} / "
                    f"{_ratio(b['queue_p95_h'], a['queue_p95_h'])}",
                    f"{a['quota_use']:.2f} / {b['quota_use']:.2f}",
                    f"{a['cluster_share']:.2f} / {b['cluster_share']:.2f}",
                    f"{b['own_device_h']:.0f} / {b['borrowed_device_h']:.0f}",
                    f"{b['preemptions']} ({b['forced']})",
                    f"{b['lost_device_h']:.1f}",
                ]
                lines.append(
                    ("| " if markdown else "") + sep.join(row) + (" |" if markdown else "")
                )
            row = [
                str(seed),
                "cluster",
                f"use {s['cluster_use']:.3f} / {t['cluster_use']:.3f}",
                f"last gang ends day {s['makespan_days']:.1f} / {t['makespan_days']:.1f}",
                "",
                "",
                "",
                "",
                "",
            ]
            lines.append(("| " if markdown else "") + sep.join(row) + (" |" if markdown else ""))
        risk = [
            by[(4, seed, "tideflow")]["teams"]["risk"]["queue_mean_h"]
            / by[(4, seed, "static")]["teams"]["risk"]["queue_mean_h"]
            for seed in seeds4
        ]
        lines += ["", f"risk queue mean, tideflow/static over seeds: {statistics.fmean(risk):.2f}"]
        lines += _large_table(runs, seeds4, markdown)
    seeds5 = sorted({r["seed"] for r in runs if r["scenario"] == 5})
    if seeds5:
        head = [
            "seed",
            "policy",
            "urgent done after h (deadline 24)",
            "long run preempted",
            "long run lost dev-h",
            "long run ends day",
            "queue mean h risk / marketing / research",
        ]
        lines += [
            "",
            "Scenario 5: urgent 32-GPU model while a 2-week 32-GPU run holds the GPUs",
            "",
        ]
        lines.append(("| " if markdown else "") + sep.join(head) + (" |" if markdown else ""))
        if markdown:
            lines.append("|" + "---|" * len(head))
        for seed in seeds5:
            for policy in ("static-wait", "static-kill", "tideflow"):
                r = by[(5, seed, policy)]
                q = r["teams"]
                row = [
                    str(seed),
                    policy,
                    f"{r['urgent_hours']:.1f} ({'met' if r['urgent_deadline_met'] else 'missed'})",
                    str(r["long_run_preemptions"]),
                    f"{r['long_run_lost_device_h']:.1f}",
                    f"{r['long_run_finish_days']:.2f}",
                    " / ".join(
                        f"{q[t]['queue_mean_h']:.1f}" for t in ("risk", "marketing", "research")
                    ),
                ]
                lines.append(
                    ("| " if markdown else "") + sep.join(row) + (" |" if markdown else "")
                )
    return "\n".join(lines)


def _large_table(runs: list[dict[str, Any]], seeds: list[int], markdown: bool) -> list[str]:
    by = {(r["scenario"], r["seed"], r["policy"]): r for r in runs}
    head = ["seed", "team", "20-GPU gangs", "first wait mean / p95 / max h (static)", "(tideflow)"]
    lines = ["", f"Scenario 4: first wait of the {LARGE}-GPU gangs", ""]
    lines.append(("| " if markdown else "") + " | ".join(head) + (" |" if markdown else ""))
    if markdown:
        lines.append("|" + "---|" * len(head))
    for seed in seeds:
        s, t = by[(4, seed, "static")]["large"], by[(4, seed, "tideflow")]["large"]
        for team in sorted(set(s) | set(t)):
            cells = [
                f"{f['mean_h']:.1f} / {f['p95_h']:.1f} / {f['max_h']:.1f}" if f else "-"
                for f in (s.get(team), t.get(team))
            ]
            gangs = (s.get(team) or t.get(team) or {}).get("gangs", 0)
            row = [str(seed), team, str(gangs), *cells]
            lines.append(("| " if markdown else "") + " | ".join(row) + (" |" if markdown else ""))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", choices=("4", "5", "all"), default="all")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--days", type=float, default=30.0, help="scenario 4's month")
    parser.add_argument("--workers", type=int, default=2, help="replays run side by side")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument(
        "--reserve-after",
        choices=("declared", "none"),
        default="declared",
        help="scheduling.reserve_after: the file's default (1800 s), or off",
    )
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    print(json.dumps({"bench": "teams", **_commit(), "reserve_after": args.reserve_after}))
    tasks: list[tuple[int, int, str, float, str]] = []
    if args.scenario in ("4", "all"):
        tasks += [
            (4, s, p, args.days, args.reserve_after) for s in seeds for p in ("static", "tideflow")
        ]
    if args.scenario in ("5", "all"):
        tasks += [
            (5, s, p, args.days, args.reserve_after)
            for s in seeds
            for p in ("static-wait", "static-kill", "tideflow")
        ]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        runs = list(pool.map(run_one, *zip(*tasks, strict=True)))
    for run in runs:
        print(json.dumps(run, sort_keys=True))
    print()
    print(table(runs, args.markdown))


if __name__ == "__main__":
    main()
