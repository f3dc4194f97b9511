"""The tidal broker against its references on production traces and on load shapes it never saw.

    .venv/bin/python bench/broker.py [--traces DIR] [--seed 1] [--markdown]
    .venv/bin/python bench/broker.py --loto      # parameters chosen on other traces
    .venv/bin/python bench/broker.py --frontier  # oracle share against the SLO target
    .venv/bin/python bench/broker.py --offered 1.0 --sweep   # the per-GPU throughput varied
    .venv/bin/python bench/broker.py --hindsight # a richer forecast fitted in hindsight
    .venv/bin/python bench/broker.py --decompose # tidal's gap: its forecast or its mechanics

For each trace: 200 GPUs in 8-GPU nodes and the same synthetic training stream
(seed) for every policy. Policies: the users' static 120 training / 80
inference split; the static split sized at the trace's 99th-percentile
inference need (with hindsight: the SLO-equivalent static split); tidal; a
cron day/night schedule (per hour of the day the highest load at that hour
over the past 7 days, re-learned daily, plus a headroom swept 0-150%; the
smallest headroom whose SLO reaches tidal's is its equal-SLO peer); and
"oracle", not a policy but a bound: the same decisions fed each window's true
load. Where the load says which windows burst (the synthetic diurnal load), also
"oracle-burst-blind", a tighter bound: each window's load known but for its
burst, with room for a burst held in the windows of least load, in the
smallest share of them that reaches tidal's SLO; and the same bound holding
the same room in every window (as a forecast's quantile does), the smallest
room reaching tidal's SLO. Prints one JSON line per
run and, per trace, the ratios the targets
are stated in: the share of the oracle's goodput gain over the p99 split that
tidal captures, and goodput and queueing against the equal-SLO cron split.

Traces: the two production traces (../shared/data/traces/, or --traces DIR);
a strongly diurnal synthetic load (night a third of the peak); and m-mid
with a weekly pattern, a holiday, a step change and a slow drift laid over
it (``research.broker.shapes``), none of which any parameter was chosen on.
The per-GPU throughput is a modelling choice (requests/s one inference GPU
serves within its latency SLO): 25 rps for m-mid and 3 rps for m-large, and
for the synthetic traces the throughput at which the 99th-percentile need is
132 GPUs, the same two thirds of the cluster.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tideflow.broker import JobSpec, LoadSource, SyntheticLoad, TraceLoad, synthetic_jobs

# research/ (the references measured here) sits beside bench/ and is not installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from research.broker.shapes import SHAPES, ShapedLoad
from research.broker.simulate import ResearchConfig, simulate

PRODUCTION = {"m-mid": ("servegen_m-mid.csv", 25.0), "m-large": ("servegen_m-large.csv", 3.0)}
DAYS = 14
TOTAL_GPUS, NODE_GPUS = 200, 8
# Gang size mixes (GPUs: weights): the default is whole 8-GPU nodes, where counting GPUs
# and placing gangs on nodes agree; the second has gangs smaller than a node.
SIZE_WEIGHTS: dict[tuple[int, ...], tuple[float, ...]] = {
    (8, 16, 32, 64): (0.4, 0.3, 0.2, 0.1),
    (1, 2, 4, 8, 16, 32): (0.2, 0.2, 0.2, 0.2, 0.1, 0.1),
}
P99_NEED_GPUS = 132  # synthetic traces: throughput at which the p99 need is two thirds of 200
CRON_HEADROOMS = tuple(round(0.05 * i, 2) for i in range(31))  # 0 .. 150%
INSURED_SHARES = tuple(round(0.05 * i, 2) for i in range(21))  # 0 .. 100% of windows
ROOMS = (100, 200)  # the uniform-room bound's room, hundredths of the calm load: 1.00-2.00x
HINDSIGHT_ROOMS = (50, 150)  # the room over the hindsight forecasts' bound, in hundredths
SWEEP_SHARES = (0.4, 0.5, 0.6, 0.68, 0.8)  # p99 inference need as a share of the cluster
# Tidal's tuned parameters, each with the values either side (chosen on m-mid and m-large).
LOTO_GRID: dict[str, tuple[float, ...]] = {
    "lend_quantile": (0.75, 0.85, 0.95),
    "cooldown_s": (1800.0, 3600.0, 7200.0),
    "lend_horizon_s": (3600.0, 7200.0, 14400.0),
    "headroom": (0.0, 0.05, 0.1),
    "forecast_quantile": (0.95, 0.99, 0.995),
    "slo_step": (0.025, 0.05, 0.1),
    "lost_work_budget": (0.0075, 0.01, 0.0125),
    "lost_work_low": (-0.1, -0.25, -0.5),
    "lost_work_high": (0.0, 0.25, 0.5),
}
FRONTIER_TARGETS = (0.95, 0.98, 0.99, 0.995, 0.998)
KEYS = (
    "training_goodput_gpu_hours",
    "underprovisioned_gpu_minutes",
    "slo_attainment",
    "preemptions",
    "lost_gpu_hours",
    "lost_fraction_of_training",
    "mean_inference_gpus",
    "forecast_mape",
    "mean_queueing_hours",
    "mean_total_queueing_hours",
    "mean_jct_hours",
    "jobs_finished",
    "placement_preemptions",  # with --placement nodes
)


@dataclass(frozen=True)
class Trace:
    name: str
    load: LoadSource
    per_gpu_rps: float
    start_s: float
    end_s: float
    seen: bool  # a production trace the defaults were chosen on


def p99_rate(trace: Trace) -> float:
    rates = sorted(s.rate for s in trace.load.samples(trace.start_s, trace.end_s) if s.rate)
    return rates[math.ceil(0.99 * len(rates)) - 1]


def p99_split(trace: Trace) -> int:
    need = math.ceil(p99_rate(trace) / trace.per_gpu_rps)
    return math.ceil(need / NODE_GPUS) * NODE_GPUS


def traces(directory: Path) -> list[Trace]:
    out = []
    for name, (file, per_gpu) in PRODUCTION.items():
        if not (directory / file).exists():
            print(f"skipping {name}: {file} not found under {directory}", file=sys.stderr)
            continue
        load = TraceLoad(directory / file)
        out.append(Trace(name, load, per_gpu, load.start_s, load.end_s, seen=True))
    synthetic: list[tuple[str, Any]] = [("diurnal", SyntheticLoad(mean_rps=2000, seed=11))]
    if (directory / PRODUCTION["m-mid"][0]).exists():
        base = TraceLoad(directory / PRODUCTION["m-mid"][0])
        synthetic += [(f"m-mid+{shape}", ShapedLoad(base, shape)) for shape in SHAPES]
    for name, load in synthetic:
        draft = Trace(name, load, 1.0, 0.0, DAYS * 86400.0, seen=False)
        out.append(replace(draft, per_gpu_rps=round(p99_rate(draft) / P99_NEED_GPUS, 3)))
    return out


PLACEMENT = ["gpus"]  # every policy of a run places gangs the same way (--placement)


def run(trace: Trace, jobs: list[JobSpec], policy: str, **overrides: Any) -> dict[str, Any]:
    config = ResearchConfig(
        policy=policy,
        total_gpus=TOTAL_GPUS,
        per_gpu_rps=trace.per_gpu_rps,
        **{
            "placement": "nodes" if PLACEMENT[0].startswith("nodes") else "gpus",
            "node_aware": PLACEMENT[0] == "nodes",
            **overrides,
        },
    )
    return simulate(trace.load, jobs, config, start_s=trace.start_s, end_s=trace.end_s).metrics


def oracle_share(tidal: dict[str, Any], peak: dict[str, Any], oracle: dict[str, Any]) -> float:
    gain = oracle["training_goodput_gpu_hours"] - peak["training_goodput_gpu_hours"]
    got = tidal["training_goodput_gpu_hours"] - peak["training_goodput_gpu_hours"]
    return round(got / gain, 3) if gain > 0 else float("nan")


class CronSweep:
    """The cron splits of one trace, each headroom run at most once."""

    def __init__(self, trace: Trace, jobs: list[JobSpec]) -> None:
        self.trace, self.jobs = trace, jobs
        self._runs: dict[float, dict[str, Any]] = {}

    def at(self, headroom: float) -> dict[str, Any]:
        if headroom not in self._runs:
            self._runs[headroom] = run(self.trace, self.jobs, f"cron:{headroom}")
        return self._runs[headroom]

    def equal_slo(self, slo: float) -> tuple[float, dict[str, Any]]:
        """The smallest cron headroom whose SLO reaches ``slo`` (or the highest swept)."""
        for headroom in CRON_HEADROOMS:
            if self.at(headroom)["slo_attainment"] >= slo:
                return headroom, self.at(headroom)
        return CRON_HEADROOMS[-1], self.at(CRON_HEADROOMS[-1])


def _ratio(numerator: float, denominator: float) -> float:
    return round(numerator / denominator, 2) if denominator > 0 else float("inf")


def cron_bound(
    tidal: dict[str, Any], oracle: dict[str, Any], cron: dict[str, Any], peer: dict[str, Any]
) -> dict[str, Any]:
    """How far the cron queueing target is in reach: the oracle against the same cron split.

    The oracle is the same decisions fed each window's true load, so if even it does
    not queue 1.3x less than the equal-SLO cron split, no forecast fed to these
    mechanics does. ``peer`` is the cron split at the oracle's own SLO.
    """
    cron_q, tidal_q, oracle_q = (
        cron["mean_queueing_hours"],
        tidal["mean_queueing_hours"],
        oracle["mean_queueing_hours"],
    )
    gain = cron_q - oracle_q
    return {
        "oracle_queueing_hours": oracle_q,
        "queueing_cron_over_oracle": _ratio(cron_q, oracle_q),
        "queueing_peer_cron_over_oracle": _ratio(peer["mean_queueing_hours"], oracle_q),
        "peer_cron_slo": peer["slo_attainment"],
        # the share of the oracle's queueing improvement over cron that tidal captures
        "cron_queueing_share": round((cron_q - tidal_q) / gain, 3) if gain > 0 else float("nan"),
    }


def burst_blind(
    trace: Trace,
    jobs: list[JobSpec],
    slo: float,
    big: dict[str, Any],
    oracle: dict[str, Any],
    *,
    sweep: CronSweep,
    **overrides: Any,
) -> dict[str, Any]:
    """The burst-blind bound at ``slo``: the smallest insured share of windows that
    reaches it (or all of them), against the cron split at the SLO it reached; then the
    same bound holding one room in every window. It runs with the overrides tidal and
    the oracle run with."""
    # the bounds' own knobs are what they search: a --set of them would collide
    overrides = {k: v for k, v in overrides.items() if k not in ("insured_share", "burst_room")}
    for share in INSURED_SHARES:
        bound = run(trace, jobs, "oracle-burst-blind", insured_share=share, **overrides)
        if bound["slo_attainment"] >= slo:
            break
    headroom, cron = sweep.equal_slo(bound["slo_attainment"])
    return {
        "blind_insured_share": share,
        "blind_slo": bound["slo_attainment"],
        "blind_lost_fraction": bound["lost_fraction_of_training"],
        "blind_oracle_share": oracle_share(bound, big, oracle),
        "blind_queueing_hours": bound["mean_queueing_hours"],
        "blind_cron_headroom": headroom,
        "blind_cron_queueing_hours": cron["mean_queueing_hours"],
        "queueing_cron_over_blind": _ratio(
            cron["mean_queueing_hours"], bound["mean_queueing_hours"]
        ),
        **uniform_room(trace, jobs, slo, big, oracle, sweep=sweep, **overrides),
    }


def smallest_room(at: Callable[[int], dict[str, Any]], rooms: tuple[int, int], slo: float) -> int:
    """The smallest room within ``rooms`` (hundredths) whose run reaches ``slo``, or the
    largest when none does, by bisection: sound only where more room never covers fewer
    windows (tests check it for the bounds bisected on)."""
    low, high = rooms
    if at(high)["slo_attainment"] >= slo:
        while low < high:
            middle = (low + high) // 2
            if at(middle)["slo_attainment"] >= slo:
                high = middle
            else:
                low = middle + 1
    return high


def uniform_room(
    trace: Trace,
    jobs: list[JobSpec],
    slo: float,
    big: dict[str, Any],
    oracle: dict[str, Any],
    *,
    sweep: CronSweep,
    **overrides: Any,
) -> dict[str, Any]:
    """The burst-blind bound holding the same room in every window: a policy that knows
    each window's calm load and, like a forecast's quantile under one calibration,
    holds room for surprises alike at every hour. The smallest room (in hundredths)
    that reaches ``slo`` (or 2x), found by bisection: more room covers every window
    it covered before, so the SLO does not fall as the room grows."""
    runs: dict[int, dict[str, Any]] = {}

    def at(room: int) -> dict[str, Any]:
        if room not in runs:
            runs[room] = run(
                trace,
                jobs,
                "oracle-burst-blind",
                insured_share=1.0,
                burst_room=room / 100,
                **overrides,
            )
        return runs[room]

    high = smallest_room(at, ROOMS, slo)
    bound = at(high)
    headroom, cron = sweep.equal_slo(bound["slo_attainment"])
    return {
        "uniform_room": high / 100,
        "uniform_reached": bound["slo_attainment"] >= slo,
        "uniform_slo": bound["slo_attainment"],
        "uniform_lost_fraction": bound["lost_fraction_of_training"],
        "uniform_oracle_share": oracle_share(bound, big, oracle),
        "uniform_queueing_hours": bound["mean_queueing_hours"],
        "uniform_cron_headroom": headroom,
        "queueing_cron_over_uniform": _ratio(
            cron["mean_queueing_hours"], bound["mean_queueing_hours"]
        ),
    }


def compare(
    trace: Trace,
    jobs: list[JobSpec],
    quiet: bool = False,
    with_burst_blind: bool = False,
    **tidal_overrides: Any,
) -> dict[str, Any]:
    """Every policy on one trace; print their lines; return the target ratios."""
    peak = p99_split(trace)
    results = {}
    for policy in ("static:80", f"static:{peak}", "tidal", "oracle"):
        started = time.perf_counter()
        overrides = tidal_overrides if policy in ("tidal", "oracle") else {}
        results[policy] = run(trace, jobs, policy, **overrides)
        line = {"trace": trace.name, "policy": policy, "per_gpu_rps": trace.per_gpu_rps}
        line |= {k: results[policy][k] for k in KEYS if k in results[policy]}
        line["seconds"] = round(time.perf_counter() - started, 1)
        if not quiet:
            print(json.dumps(line))
    tidal, small, big = results["tidal"], results["static:80"], results[f"static:{peak}"]
    sweep = CronSweep(trace, jobs)
    headroom, cron = sweep.equal_slo(tidal["slo_attainment"])
    peer_headroom, peer = sweep.equal_slo(results["oracle"]["slo_attainment"])
    if not quiet:
        for h, metrics in ((headroom, cron), (peer_headroom, peer)):
            line = {"trace": trace.name, "policy": f"cron:{h}", "per_gpu_rps": trace.per_gpu_rps}
            print(json.dumps(line | {k: metrics[k] for k in KEYS if k in metrics}))
    return {
        "trace": trace.name,
        "seen": trace.seen,
        "per_gpu_rps": trace.per_gpu_rps,
        "p99_static_inference_gpus": peak,
        "tidal_slo": tidal["slo_attainment"],
        "tidal_lost_fraction": tidal["lost_fraction_of_training"],
        "tidal_slo_promised": tidal.get("slo_promised"),
        "tidal_saturated_windows": tidal.get("calibration_saturated_windows"),
        "tidal_goodput": tidal["training_goodput_gpu_hours"],
        "oracle_share": oracle_share(tidal, big, results["oracle"]),
        "cron_headroom": headroom,
        "cron_slo": cron["slo_attainment"],
        "goodput_vs_cron": round(
            tidal["training_goodput_gpu_hours"] / cron["training_goodput_gpu_hours"], 3
        ),
        "queueing_cron_over_tidal": round(
            cron["mean_queueing_hours"] / tidal["mean_queueing_hours"], 2
        ),
        # every wait, the requeues after preemptions too: stopping gangs more often than
        # cron does costs tidal here, not in the first wait alone
        "total_queueing_cron_over_tidal": _ratio(
            cron["mean_total_queueing_hours"], tidal["mean_total_queueing_hours"]
        ),
        "tidal_total_queueing_hours": tidal["mean_total_queueing_hours"],
        "cron_total_queueing_hours": cron["mean_total_queueing_hours"],
        "goodput_vs_p99_static": round(
            tidal["training_goodput_gpu_hours"] / big["training_goodput_gpu_hours"], 3
        ),
        "goodput_vs_120_80": round(
            tidal["training_goodput_gpu_hours"] / small["training_goodput_gpu_hours"], 3
        ),
        "queueing_p99_static_over_tidal": round(
            big["mean_queueing_hours"] / tidal["mean_queueing_hours"], 2
        ),
        "tidal_queueing_hours": tidal["mean_queueing_hours"],
        "cron_queueing_hours": cron["mean_queueing_hours"],
        "peer_cron_headroom": peer_headroom,
        **cron_bound(tidal, results["oracle"], cron, peer),
        **(
            burst_blind(
                trace,
                jobs,
                tidal["slo_attainment"],
                big,
                results["oracle"],
                sweep=sweep,
                **tidal_overrides,
            )
            if with_burst_blind and hasattr(trace.load, "burst_at")
            else {}
        ),
    }


def _at_tidals_slo(
    trace: Trace,
    jobs: list[JobSpec],
    policy: str,
    key: str,
    *,
    slo: float,
    big: dict[str, Any],
    oracle: dict[str, Any],
    sweep: CronSweep,
    **overrides: Any,
) -> dict[str, Any]:
    """A hindsight forecast at the smallest room over its bound (hundredths, by
    bisection) that reaches ``slo``, against the oracle and the cron split at the SLO it
    reached; its figures keyed ``{key}_...``."""
    runs: dict[int, dict[str, Any]] = {}

    def at(room: int) -> dict[str, Any]:
        if room not in runs:
            runs[room] = run(trace, jobs, policy, hindsight_room=room / 100, **overrides)
        return runs[room]

    high = smallest_room(at, HINDSIGHT_ROOMS, slo)
    bound = at(high)
    _, cron = sweep.equal_slo(bound["slo_attainment"])
    return {
        f"{key}_room": high / 100,
        f"{key}_slo": bound["slo_attainment"],
        f"{key}_oracle_share": oracle_share(bound, big, oracle),
        f"{key}_lost_fraction": bound["lost_fraction_of_training"],
        f"{key}_queueing_hours": bound["mean_queueing_hours"],
        f"queueing_cron_over_{key}": _ratio(
            cron["mean_queueing_hours"], bound["mean_queueing_hours"]
        ),
    }


def _tidal_row(
    trace: Trace, jobs: list[JobSpec], **overrides: Any
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], CronSweep]:
    """Tidal, the p99 split and the oracle on one trace: the row's first cells, and the
    references every other figure of the row is measured against."""
    big = run(trace, jobs, f"static:{p99_split(trace)}")
    tidal = run(trace, jobs, "tidal", **overrides)
    oracle = run(trace, jobs, "oracle", **overrides)
    sweep = CronSweep(trace, jobs)
    row: dict[str, Any] = {
        "trace": trace.name,
        "tidal_slo": tidal["slo_attainment"],
        "oracle_share": oracle_share(tidal, big, oracle),
        "tidal_lost_fraction": tidal["lost_fraction_of_training"],
        "tidal_queueing_hours": tidal["mean_queueing_hours"],
        "queueing_cron_over_tidal": _ratio(
            sweep.equal_slo(tidal["slo_attainment"])[1]["mean_queueing_hours"],
            tidal["mean_queueing_hours"],
        ),
    }
    return row, big, oracle, sweep


def hindsight(trace: Trace, jobs: list[JobSpec], **overrides: Any) -> dict[str, Any]:
    """Tidal against a richer forecast fitted to the trace itself (``oracle-hindsight``)
    and to its other half (``-cross``), each at the smallest room over its bound (in
    hundredths, by bisection) that reaches tidal's SLO, fed to the same mechanics with no
    cooldown; against the oracle and the cron split at the SLO each reached."""
    row, big, oracle, sweep = _tidal_row(trace, jobs, **overrides)
    for policy, key in (("oracle-hindsight", "fitted"), ("oracle-hindsight-cross", "cross")):
        row |= _at_tidals_slo(
            trace,
            jobs,
            policy,
            key,
            slo=row["tidal_slo"],
            big=big,
            oracle=oracle,
            sweep=sweep,
            **overrides,
        )
    return row


def decompose(trace: Trace, jobs: list[JobSpec], **overrides: Any) -> dict[str, Any]:
    """Tidal's gap to the oracle split into its forecast's share and its mechanics'.

    The oracle is lean: it needs no cooldown and its lend bound reads the load ahead.
    Given tidal's cooldown, tidal's lend bound (from the past, spending the lost-work
    budget) or both (``bound_mechanics``), it shows what a perfect next-window forecast
    would reach with tidal's mechanics; the rest of the gap is the forecast's. The
    forecast fitted on the trace's other half is then run both lean and with tidal's
    mechanics, each at the smallest room reaching tidal's SLO: whether a better
    forecast helps inside tidal as it is."""
    row, big, oracle, sweep = _tidal_row(trace, jobs, **overrides)
    _, cron = sweep.equal_slo(row["tidal_slo"])  # the cron bound's reference
    for mechanics in ("cooldown", "lend", "tidal"):
        kept = run(trace, jobs, "oracle", bound_mechanics=mechanics, **overrides)
        row |= {
            f"oracle_{mechanics}_oracle_share": oracle_share(kept, big, oracle),
            f"oracle_{mechanics}_slo": kept["slo_attainment"],
            f"oracle_{mechanics}_lost_fraction": kept["lost_fraction_of_training"],
            f"queueing_cron_over_oracle_{mechanics}": _ratio(
                cron["mean_queueing_hours"], kept["mean_queueing_hours"]
            ),
        }
    for mechanics, key in (("lean", "cross"), ("tidal", "cross_tidal")):
        row |= _at_tidals_slo(
            trace,
            jobs,
            "oracle-hindsight-cross",
            key,
            slo=row["tidal_slo"],
            big=big,
            oracle=oracle,
            sweep=sweep,
            bound_mechanics=mechanics,
            **overrides,
        )
    return row


def _fitted_cell(row: dict[str, Any], key: str) -> str:
    """A hindsight forecast's cell: its room, SLO, oracle share, lost work, cron / it."""
    return (
        f"{row[f'{key}_room']:.2f}x, {row[f'{key}_slo']:.2%}, "
        f"{row[f'{key}_oracle_share']:.0%}, {row[f'{key}_lost_fraction']:.2%}, "
        f"{row[f'queueing_cron_over_{key}']:.2f}x"
    )


def decompose_markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| trace | tidal: oracle share, lost work, cron / tidal "
        "| the oracle with tidal's cooldown | with tidal's lend bound | with both "
        "| fitted on the other half, lean: room, SLO, share, lost work, cron / it "
        "| the same with tidal's mechanics |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [
            f"{r['oracle_share']:.0%}, {r['tidal_lost_fraction']:.2%}, "
            f"{r['queueing_cron_over_tidal']:.2f}x"
        ]
        for mechanics in ("cooldown", "lend", "tidal"):
            cells.append(
                f"{r[f'oracle_{mechanics}_oracle_share']:.0%}, "
                f"{r[f'oracle_{mechanics}_lost_fraction']:.2%}, "
                f"{r[f'queueing_cron_over_oracle_{mechanics}']:.2f}x"
            )
        cells += [_fitted_cell(r, key) for key in ("cross", "cross_tidal")]
        lines.append(f"| {r['trace']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def hindsight_markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| trace | tidal: oracle share, SLO, lost work, cron / tidal "
        "| fitted in hindsight: room, SLO, oracle share, lost work, cron / it "
        "| fitted on the other half: room, SLO, oracle share, lost work, cron / it |",
        "|---|---|---|---|",
    ]
    for r in rows:
        cells = [
            f"{r['oracle_share']:.0%}, {r['tidal_slo']:.2%}, {r['tidal_lost_fraction']:.2%}, "
            f"{r['queueing_cron_over_tidal']:.2f}x"
        ]
        cells += [_fitted_cell(r, key) for key in ("fitted", "cross")]
        lines.append(f"| {r['trace']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets_met(row: dict[str, Any]) -> dict[str, bool]:
    return {
        "oracle_share>=0.9": row["oracle_share"] >= 0.9,
        "queueing_vs_cron>=1.3": row["queueing_cron_over_tidal"] >= 1.3,
        "slo>=0.995": row["tidal_slo"] >= 0.995,
        "lost<=0.01": row["tidal_lost_fraction"] <= 0.01,
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| trace | per-GPU rps | oracle share | SLO | lost work | cron headroom (SLO) "
        "| goodput vs cron | queueing: cron / tidal | every wait: cron / tidal |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = r["trace"] if r["seen"] else f"{r['trace']} (unseen)"
        lines.append(
            f"| {name} | {r['per_gpu_rps']:g} | {r['oracle_share']:.0%} | {r['tidal_slo']:.2%} "
            f"| {r['tidal_lost_fraction']:.2%} | {r['cron_headroom']:.0%} ({r['cron_slo']:.2%}) "
            f"| {r['goodput_vs_cron']:.2f}x | {r['queueing_cron_over_tidal']:.2f}x "
            f"| {r['total_queueing_cron_over_tidal']:.2f}x |"
        )
    lines += [
        "",
        "| trace | mean queueing: cron / tidal / oracle | cron / oracle (the bound) "
        "| oracle vs cron at its own SLO (headroom) "
        "| tidal's share of the oracle's gain over cron |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['trace']} | {r['cron_queueing_hours']:.1f} / {r['tidal_queueing_hours']:.1f} / "
            f"{r['oracle_queueing_hours']:.1f} h | {r['queueing_cron_over_oracle']:.2f}x "
            f"| {r['queueing_peer_cron_over_oracle']:.2f}x ({r['peer_cron_headroom']:.0%}, "
            f"SLO {r['peer_cron_slo']:.2%}) | {r['cron_queueing_share']:.0%} |"
        )
    blind = [r for r in rows if "blind_slo" in r]
    if blind:
        lines += [
            "",
            "| trace | burst-blind bound: windows insured, SLO, lost work "
            "| oracle share: tidal / bound | mean queueing: tidal / bound "
            "| cron at the bound's SLO (headroom) | cron / bound |",
            "|---|---|---|---|---|---|",
        ]
        for r in blind:
            lines.append(
                f"| {r['trace']} | {r['blind_insured_share']:.0%}, {r['blind_slo']:.2%}, "
                f"{r['blind_lost_fraction']:.2%} | {r['oracle_share']:.0%} / "
                f"{r['blind_oracle_share']:.0%} | {r['tidal_queueing_hours']:.1f} / "
                f"{r['blind_queueing_hours']:.1f} h | {r['blind_cron_queueing_hours']:.1f} h "
                f"({r['blind_cron_headroom']:.0%}) | {r['queueing_cron_over_blind']:.2f}x |"
            )
        lines += [
            "",
            "| trace | the same room in every window: room, SLO, lost work "
            "| oracle share: tidal / bound | mean queueing: tidal / bound "
            "| cron / tidal | cron / bound (cron's headroom) |",
            "|---|---|---|---|---|---|",
        ]
        for r in blind:
            lines.append(
                f"| {r['trace']} | {r['uniform_room']:.2f}x"
                f"{'' if r['uniform_reached'] else ' (tidal SLO not reached)'}, "
                f"{r['uniform_slo']:.2%}, "
                f"{r['uniform_lost_fraction']:.2%} | {r['oracle_share']:.0%} / "
                f"{r['uniform_oracle_share']:.0%} | {r['tidal_queueing_hours']:.1f} / "
                f"{r['uniform_queueing_hours']:.1f} h | {r['queueing_cron_over_tidal']:.2f}x "
                f"| {r['queueing_cron_over_uniform']:.2f}x ({r['uniform_cron_headroom']:.0%}) |"
            )
    return "\n".join(lines)


def score(row: dict[str, Any]) -> float:
    """How a parameter value is chosen: oracle share, if the SLO and lost-work targets hold."""
    ok = row["tidal_slo"] >= 0.995 and row["tidal_lost_fraction"] <= 0.01
    return row["oracle_share"] if ok else row["oracle_share"] - 10


def leave_one_trace_out(
    all_traces: list[Trace], jobs: dict[str, list[JobSpec]], keys: list[str] | None = None
) -> None:
    """Each grid value on every trace; for each trace, the values chosen on the others."""
    variants: list[dict[str, float]] = [{}]
    for name, values in LOTO_GRID.items():
        if keys and name not in keys:
            continue
        default = getattr(ResearchConfig(policy="tidal"), name)
        variants += [{name: v} for v in values if v != default]
    table: dict[tuple[str, str], dict[str, Any]] = {}
    for variant in variants:
        label = ",".join(f"{k}={v:g}" for k, v in variant.items()) or "default"
        for trace in all_traces:
            row = compare(trace, jobs[trace.name], quiet=True, **variant)
            table[label, trace.name] = row
            print(json.dumps({"variant": label} | row), flush=True)
    labels = list(dict.fromkeys(label for label, _ in table))
    for held_out in all_traces:
        others = [t.name for t in all_traces if t.name != held_out.name]
        chosen = max(labels, key=lambda lb: statistics.fmean(score(table[lb, o]) for o in others))
        best = max(labels, key=lambda lb: score(table[lb, held_out.name]))
        print(
            json.dumps(
                {
                    "held_out": held_out.name,
                    "chosen_on_others": chosen,
                    "its_oracle_share": table[chosen, held_out.name]["oracle_share"],
                    "its_slo": table[chosen, held_out.name]["tidal_slo"],
                    "default_oracle_share": table["default", held_out.name]["oracle_share"],
                    "default_slo": table["default", held_out.name]["tidal_slo"],
                    "best_in_hindsight": best,
                    "best_oracle_share": table[best, held_out.name]["oracle_share"],
                    "best_slo": table[best, held_out.name]["tidal_slo"],
                }
            )
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
    parser.add_argument("--traces", type=Path, default=default)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", action="append", help="trace name(s) to run (default: all)")
    parser.add_argument(
        "--offered",
        type=float,
        default=0.55,
        help="training demand as a share of the cluster's GPU-hours (1.0: a saturating backlog)",
    )
    parser.add_argument(
        "--elastic-share",
        type=float,
        default=0.0,
        help="share of the gangs of 16+ GPUs that are elastic down to half their size",
    )
    parser.add_argument(
        "--short-share",
        type=float,
        default=0.0,
        help="share of the arrivals that are short jobs (8 GPUs, 15-90 min: evaluations, "
        "sweeps), the offered GPU-hours unchanged",
    )
    parser.add_argument(
        "--sizes",
        type=lambda text: tuple(int(x) for x in text.split(",")),
        choices=sorted(SIZE_WEIGHTS),
        help="gang sizes in GPUs, comma-separated (default 8,16,32,64: whole nodes)",
    )
    parser.add_argument(
        "--placement",
        choices=("gpus", "nodes", "nodes-by-count"),
        default="gpus",
        help="count GPUs, or place gangs and inference on 8-GPU nodes, for every policy "
        "(nodes-by-count: placed, but the policy chooses its victims by count)",
    )
    parser.add_argument("--markdown", action="store_true", help="also print the summary table")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a tidal ResearchConfig field for this run (measures one mechanism)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--loto", action="store_true", help="leave-one-trace-out parameter choice")
    parser.add_argument(
        "--loto-key",
        action="append",
        choices=sorted(LOTO_GRID),
        help="with --loto: vary only these parameters (default: all)",
    )
    mode.add_argument("--frontier", action="store_true", help="oracle share per SLO target")
    mode.add_argument(
        "--hindsight",
        action="store_true",
        help="tidal against a richer forecast fitted to the trace (and to its other half)",
    )
    mode.add_argument(
        "--decompose",
        action="store_true",
        help="tidal's gap to the oracle: the oracle with tidal's cooldown and lend bound, "
        "and the forecast fitted on the other half with and without them",
    )
    mode.add_argument(
        "--sweep",
        action="store_true",
        help="vary the per-GPU throughput so that the p99 need is 40-80%% of the cluster",
    )
    args = parser.parse_args()
    PLACEMENT[0] = args.placement
    overrides = _overrides(parser, args)
    chosen = [t for t in traces(args.traces) if not args.only or t.name in args.only]
    jobs = {
        t.name: synthetic_jobs(
            seed=args.seed,
            total_gpus=TOTAL_GPUS,
            horizon_s=t.end_s - t.start_s,
            offered_fraction=args.offered,
            elastic_fraction=args.elastic_share,
            short_fraction=args.short_share,
            **({"sizes": args.sizes, "weights": SIZE_WEIGHTS[args.sizes]} if args.sizes else {}),
        )
        for t in chosen
    }
    if args.loto:
        leave_one_trace_out(chosen, jobs, args.loto_key)
        return 0
    rows = []
    for trace in chosen:
        if args.hindsight or args.decompose:
            measure = decompose if args.decompose else hindsight
            rows.append(measure(trace, jobs[trace.name], **overrides))
            print(json.dumps(rows[-1]), flush=True)
            continue
        if args.frontier:
            for target in FRONTIER_TARGETS:
                row = compare(trace, jobs[trace.name], quiet=True, slo_target=target, **overrides)
                print(json.dumps({"slo_target": target} | row), flush=True)
            continue
        if args.sweep:
            for share in SWEEP_SHARES:
                throughput = round(p99_rate(trace) / (share * TOTAL_GPUS), 3)
                row = compare(replace(trace, per_gpu_rps=throughput), jobs[trace.name], quiet=True)
                print(json.dumps({"p99_need_share": share, "offered": args.offered} | row))
            continue
        row = compare(trace, jobs[trace.name], with_burst_blind=True, **overrides)
        rows.append(row)
        print(json.dumps(row | {"targets_met": targets_met(row)}), flush=True)
    if args.markdown and rows:
        table = (
            decompose_markdown
            if args.decompose
            else hindsight_markdown
            if args.hindsight
            else markdown
        )
        print(table(rows))
    return 0


def _overrides(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """The --set fields, refusing by name those the chosen mode varies itself."""
    overrides = {k: _number(v) for k, _, v in (item.partition("=") for item in args.set)}
    if "bound_mechanics" in overrides:
        parser.error("--set bound_mechanics: tidal has none; --decompose varies the bounds'")
    if "hindsight_room" in overrides and (args.hindsight or args.decompose):
        parser.error("--set hindsight_room: --hindsight and --decompose vary it themselves")
    return overrides


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


if __name__ == "__main__":
    sys.exit(main())
