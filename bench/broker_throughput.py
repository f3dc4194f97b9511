"""The broker's per-GPU throughput learned from the serving side, against a configured one.

For each trace and each configured error (the per-GPU throughput set to 0.5x
to 1.5x the truth), the broker is replayed twice in the same run, with and
without learning (``tideflow.broker.throughput``), and scored on the latency
SLO's attainment (windows whose latency held the SLO, of those with load)
and the mean inference GPUs.

The serving side is a model (``tideflow.broker.load.SyntheticLatency``: a
queue per GPU whose latency at the SLO's percentile reaches the SLO exactly
at the true per-GPU throughput, with seeded log-normal noise of 10% per
window), since no serving system runs here. The broker's own forecaster, SLO
calibration and ``decide`` run every window, and the learner sees only the
windows already served, replaying the last week from the rate it learned
before, as the service does. The cluster is sized so that the 0.5x broker's
peak fits (the broker is never capped by the cluster).

    .venv/bin/python bench/broker_throughput.py [--traces DIR] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tideflow.broker.load import LoadSource, SyntheticLatency, SyntheticLoad, TraceLoad
from tideflow.broker.policy import PolicyConfig

# research/ (the references measured here) sits beside bench/ and is not installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from research.broker.learning import replay_learning

TRACES = {"m-mid": ("servegen_m-mid.csv", 25.0), "m-large": ("servegen_m-large.csv", 3.0)}
FACTORS = (0.5, 0.7, 1.0, 1.3, 1.5)
SLO_S = 1.0


@dataclass(frozen=True)
class Case:
    name: str
    load: LoadSource
    true_rps: float
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Outcome:
    attainment: float  # windows whose latency held the SLO, of those with load
    attainment_after_day1: float
    mean_gpus: float
    final_rps: float
    within_5pct_h: float | None  # hours until the estimate first came within 1.05x the truth


def replay(case: Case, factor: float, *, learn: bool) -> Outcome:
    """The broker planning at ``factor`` times the true throughput, learning it or not."""
    step = case.load.window_s
    raw = case.load.samples(case.start_s, case.end_s)
    peak = max(s.rate or 0.0 for s in raw)
    node = 8
    total = math.ceil(peak / case.true_rps / 0.5 * 1.1 / node) * node
    configured = PolicyConfig(
        total_gpus=total,
        per_gpu_rps=case.true_rps * factor,
        node_gpus=node,
        headroom=0.05,
        min_inference_gpus=node,
        lead_s=step,
    )
    serving = SyntheticLatency(case.true_rps, slo_s=SLO_S, window_s=step)
    windows = replay_learning(
        raw, configured, lambda _start: serving, SLO_S, learn=learn, window_s=step
    )
    within = next(
        ((w.start_s - case.start_s) / 3600 for w in windows if w.estimate <= 1.05 * case.true_rps),
        None,
    )
    served = [w for w in windows if w.rate and w.latency is not None]
    held = [w.latency is not None and w.latency <= SLO_S for w in served]
    return Outcome(
        attainment=sum(held) / len(held),
        attainment_after_day1=sum(held[144:]) / len(held[144:]),
        mean_gpus=statistics.fmean(w.gpus for w in served),
        final_rps=windows[-1].estimate,
        within_5pct_h=within,
    )


def cases(directory: Path) -> list[Case]:
    out = []
    for name, (file, true_rps) in TRACES.items():
        trace = TraceLoad(directory / file)
        out.append(Case(name, trace, true_rps, trace.start_s, trace.end_s))
    synthetic = SyntheticLoad(mean_rps=1000.0, seed=3)
    out.append(Case("synthetic", synthetic, 25.0, 0.0, 14 * 86400.0))
    return out


def compare(case: Case, factor: float) -> dict[str, float | str | None]:
    blind = replay(case, factor, learn=False)
    learning = replay(case, factor, learn=True)
    return {
        "trace": case.name,
        "true_rps": case.true_rps,
        "configured": factor,
        "slo_without": blind.attainment,
        "slo_learning": learning.attainment,
        "slo_learning_after_day1": learning.attainment_after_day1,
        "gpus_without": blind.mean_gpus,
        "gpus_learning": learning.mean_gpus,
        "gpus_ratio": learning.mean_gpus / blind.mean_gpus,
        "learned": learning.final_rps / case.true_rps,
        "within_5pct_h": learning.within_5pct_h if factor > 1.05 else None,
    }


def markdown(rows: list[dict[str, float | str | None]]) -> str:
    lines = [
        "| trace | configured | SLO without | SLO learning (after day 1) "
        "| GPUs without | GPUs learning | GPUs ratio | learned at the end | within 1.05x after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        hours = r["within_5pct_h"]
        lines.append(
            f"| {r['trace']} | {r['configured']:.1f}x | {r['slo_without']:.2%} "
            f"| {r['slo_learning']:.2%} ({r['slo_learning_after_day1']:.2%}) "
            f"| {r['gpus_without']:.1f} | {r['gpus_learning']:.1f} | {r['gpus_ratio']:.2f} "
            f"| {r['learned']:.2f}x | {'' if hours is None else f'{hours:.1f} h'} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=Path("../shared/data/traces"))
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    rows: list[dict[str, float | str | None]] = []
    for case in cases(args.traces):
        for factor in FACTORS:
            rows.append(compare(case, factor))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(markdown(rows) if args.markdown else json.dumps(rows, indent=2))
    print(f"{time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
