"""The tidal broker against static splits on production inference traces.

    .venv/bin/python bench/broker.py [--traces DIR] [--seed 1]

For each trace: 200 GPUs in 8-GPU nodes, the same synthetic training stream
(seed) for every policy, and three policies: the users' static 120 training /
80 inference split, a static split sized for the trace's 99th-percentile
inference need (sized with hindsight, so it is an upper baseline), and
tidal; and "oracle", not a policy but a bound: the same decisions fed each
window's true load (no forecast error, no cooldown). Prints one JSON line per
run and the ratios the targets are stated in.
The per-GPU throughput is a modelling choice (requests/s one inference GPU
serves within its latency SLO), chosen so that the 99th-percentile need is
about two thirds of the cluster, as in the users' 200-GPU scenario.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from tideflow.broker import SimulationConfig, TraceLoad, simulate, synthetic_jobs

TRACES = {"servegen_m-mid.csv": 25.0, "servegen_m-large.csv": 3.0}  # file -> per-GPU rps
SWEEP_SHARES = (0.4, 0.5, 0.6, 0.68, 0.8)  # p99 inference need as a share of the cluster
KEYS = (
    "training_goodput_gpu_hours",
    "underprovisioned_gpu_minutes",
    "slo_attainment",
    "preemptions",
    "lost_gpu_hours",
    "lost_fraction_of_training",
    "mean_gpu_utilization",
    "mean_inference_gpus",
    "forecast_mape",
    "mean_queueing_hours",
    "mean_jct_hours",
    "jobs_finished",
)


def p99_split(load: TraceLoad, per_gpu_rps: float, node_gpus: int) -> int:
    need = math.ceil(p99_rate(load) / per_gpu_rps)
    return math.ceil(need / node_gpus) * node_gpus


def compare(load: TraceLoad, name: str, per_gpu: float, jobs: list, quiet: bool = False) -> dict:
    """Run the four policies on one trace; print their lines; return the target ratios."""
    peak = p99_split(load, per_gpu, 8)
    results = {}
    for policy in ("static:80", f"static:{peak}", "tidal", "oracle"):
        started = time.perf_counter()
        config = SimulationConfig(policy=policy, total_gpus=200, per_gpu_rps=per_gpu)
        metrics = simulate(load, jobs, config).metrics
        results[policy] = metrics
        line = {"trace": name, "policy": policy, "per_gpu_rps": per_gpu}
        line |= {k: metrics[k] for k in KEYS}
        line["seconds"] = round(time.perf_counter() - started, 1)
        if not quiet:
            print(json.dumps(line))
    tidal, small, big = results["tidal"], results["static:80"], results[f"static:{peak}"]
    return {
        "trace": name,
        "per_gpu_rps": per_gpu,
        "p99_static_inference_gpus": peak,
        "tidal_slo": tidal["slo_attainment"],
        "tidal_lost_fraction": tidal["lost_fraction_of_training"],
        "underprovisioned_reduction_vs_120_80": round(
            1 - tidal["underprovisioned_gpu_minutes"] / small["underprovisioned_gpu_minutes"], 4
        )
        if small["underprovisioned_gpu_minutes"]
        else None,
        "goodput_vs_120_80": round(
            tidal["training_goodput_gpu_hours"] / small["training_goodput_gpu_hours"], 3
        ),
        "goodput_vs_p99_static": round(
            tidal["training_goodput_gpu_hours"] / big["training_goodput_gpu_hours"], 3
        ),
        "goodput_oracle_vs_120_80": round(
            results["oracle"]["training_goodput_gpu_hours"] / small["training_goodput_gpu_hours"],
            3,
        ),
        "goodput_oracle_vs_p99_static": round(
            results["oracle"]["training_goodput_gpu_hours"] / big["training_goodput_gpu_hours"],
            3,
        ),
        "queueing_p99_static_over_tidal": round(
            big["mean_queueing_hours"] / tidal["mean_queueing_hours"], 2
        ),
    }


def p99_rate(load: TraceLoad) -> float:
    rates = sorted(s.rate for s in load.samples(load.start_s, load.end_s) if s.rate)
    return rates[math.ceil(0.99 * len(rates)) - 1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
    parser.add_argument("--traces", type=Path, default=default)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--offered",
        type=float,
        default=0.55,
        help="training demand as a share of the cluster's GPU-hours (1.0: a saturating backlog)",
    )
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="instead: vary the per-GPU throughput so that the trace's 99th-percentile need "
        "is 40-80%% of the cluster, and print the target ratios at each",
    )
    args = parser.parse_args()
    for name, per_gpu in TRACES.items():
        path = args.traces / name
        if not path.exists():
            print(f"skipping {name}: not found under {args.traces}", file=sys.stderr)
            continue
        load = TraceLoad(path)
        jobs = synthetic_jobs(
            seed=args.seed,
            total_gpus=200,
            horizon_s=load.end_s - load.start_s,
            offered_fraction=args.offered,
        )
        if not args.sweep:
            print(json.dumps(compare(load, name, per_gpu, jobs)))
            continue
        for share in SWEEP_SHARES:
            # per-GPU throughput at which the p99 rate needs `share` of the 200 GPUs
            throughput = round(p99_rate(load) / (share * 200), 3)
            ratios = compare(load, name, throughput, jobs, quiet=True)
            print(json.dumps({"p99_need_share": share, "offered": args.offered} | ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
