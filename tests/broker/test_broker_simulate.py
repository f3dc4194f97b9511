"""The broker simulator: same inputs, same result; static policies never preempt; on a
diurnal load the tidal policy gives training more while keeping inference served; a
real production trace runs through it (skipped, saying why, where ../shared is absent)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tideflow.broker import SimulationConfig, SyntheticLoad, TraceLoad, simulate, synthetic_jobs
from tideflow.broker.jobs import JobSpec
from tideflow.cli import main

SHARED_TRACES = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces"
DAYS = 4


@pytest.fixture(scope="module")
def diurnal() -> SyntheticLoad:
    # Night load about a third of the daytime peak, as in the users' clusters.
    return SyntheticLoad(mean_rps=2000, daily_amplitude=0.5, seed=11)


@pytest.fixture(scope="module")
def results(diurnal: SyntheticLoad) -> dict[str, dict[str, float]]:
    jobs = synthetic_jobs(seed=2, total_gpus=200, horizon_s=DAYS * 86400)
    out = {}
    for policy in ("static:80", "static:136", "static:160", "tidal"):
        config = SimulationConfig(policy=policy, per_gpu_rps=25.0)
        out[policy] = simulate(diurnal, jobs, config, start_s=0, end_s=DAYS * 86400).metrics
    return out


def test_same_seed_same_result(diurnal: SyntheticLoad) -> None:
    jobs = synthetic_jobs(seed=2, total_gpus=200, horizon_s=DAYS * 86400)
    config = SimulationConfig(policy="tidal", per_gpu_rps=25.0)
    assert (
        simulate(diurnal, jobs, config, start_s=0, end_s=DAYS * 86400).metrics
        == simulate(diurnal, jobs, config, start_s=0, end_s=DAYS * 86400).metrics
    )


def test_static_policies_never_preempt(results: dict[str, dict[str, float]]) -> None:
    for policy in ("static:80", "static:136"):
        assert results[policy]["preemptions"] == 0 and results[policy]["lost_gpu_hours"] == 0


def test_tidal_serves_inference_and_gives_training_more_than_a_static_split(
    results: dict[str, dict[str, float]],
) -> None:
    tidal, small, peak = results["tidal"], results["static:80"], results["static:160"]
    assert tidal["underprovisioned_gpu_minutes"] <= 0.1 * small["underprovisioned_gpu_minutes"]
    # static:160 is the smallest static split that meets a 99.5% SLO here
    assert results["static:136"]["slo_attainment"] < 0.995 <= peak["slo_attainment"]
    # A 99.5% SLO over these 576 windows allows 2.9 missed windows: tidal misses at most 3
    # (the synthetic load has unforeseeable one-window bursts of 1.6x in 1% of windows).
    scored = tidal["windows"] - tidal["gap_windows"]
    assert round((1 - tidal["slo_attainment"]) * scored) <= math.ceil(0.005 * scored)
    assert tidal["training_goodput_gpu_hours"] >= 1.5 * peak["training_goodput_gpu_hours"]
    assert tidal["mean_queueing_hours"] < peak["mean_queueing_hours"]
    assert tidal["lost_fraction_of_training"] < 0.02  # checkpoint-before-evict
    assert tidal["forecast_mape"] < 0.2


def test_cli_simulate_prints_the_metrics_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    code = main(
        [
            "broker",
            "simulate",
            "--trace",
            "synthetic",
            "--days",
            "2",
            "--per-gpu-rps",
            "25",
            "--policy",
            "static:96",
            "--json",
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    for key in (
        "training_goodput_gpu_hours",
        "underprovisioned_gpu_minutes",
        "slo_attainment",
        "preemptions",
        "lost_gpu_hours",
        "mean_gpu_utilization",
        "forecast_mape",
        "mean_queueing_hours",
        "mean_jct_hours",
    ):
        assert key in result
    assert result["policy"] == "static:96" and result["per_gpu_rps"] == 25.0


def test_cli_rejects_a_bad_policy(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["broker", "simulate", "--trace", "synthetic", "--per-gpu-rps", "25", "--policy", "tidl"]
    )
    assert code == 2
    assert "use 'tidal', 'static:N'" in capsys.readouterr().err


@pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason=f"no production traces at {SHARED_TRACES}")
def test_production_trace_with_outages_runs_and_keeps_the_slo() -> None:
    load = TraceLoad(SHARED_TRACES / "servegen_m-mid.csv")
    jobs = synthetic_jobs(seed=1, total_gpus=200, horizon_s=load.end_s - load.start_s)
    result = simulate(load, jobs, SimulationConfig(policy="tidal", per_gpu_rps=25.0)).metrics
    assert result["gap_windows"] >= 84  # its zero windows (and near-zero outages) are gaps
    assert result["slo_attainment"] >= 0.99
    assert result["lost_fraction_of_training"] < 0.02


def test_a_load_without_bounds_needs_a_window(diurnal: SyntheticLoad) -> None:
    with pytest.raises(ValueError, match="give start_s < end_s"):
        simulate(diurnal, [], SimulationConfig(policy="static:80", per_gpu_rps=25.0))


def test_the_calibrations_step_is_the_one_configured(diurnal: SyntheticLoad) -> None:
    """``slo_step`` reaches the SLO calibration (the benchmark varies it, leave one trace
    out): with a vanishing step the bound is never scaled, as without a calibration,
    and the default step moves it."""
    jobs = synthetic_jobs(seed=2, total_gpus=200, horizon_s=DAYS * 86400)

    def held(**config: float | None) -> float:
        settings = SimulationConfig(policy="tidal", per_gpu_rps=25.0, **config)  # type: ignore[arg-type]
        result = simulate(diurnal, jobs, settings, start_s=0, end_s=DAYS * 86400)
        return float(result.metrics["mean_inference_gpus"])

    uncalibrated = held(slo_target=None)
    assert held(slo_step=1e-9) == pytest.approx(uncalibrated, abs=0.05)
    assert abs(held(slo_step=0.05) - uncalibrated) > 0.5


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_stream_with_short_jobs_offers_the_same_gpu_hours(seed: int) -> None:
    horizon = 60 * 86400.0
    plain = synthetic_jobs(seed=seed, total_gpus=200, horizon_s=horizon)
    mixed = synthetic_jobs(seed=seed, total_gpus=200, horizon_s=horizon, short_fraction=0.3)
    short = [j for j in mixed if j.work_s < 2 * 3600]  # the long jobs run 2-12 h
    assert not [j for j in plain if j.work_s < 2 * 3600]
    assert len(short) / len(mixed) == pytest.approx(0.3, abs=0.05)
    assert all(j.gpus == 8 and 900 <= j.work_s <= 5400 for j in short)

    def offered(jobs: list[JobSpec]) -> float:  # over the 85% of the horizon they arrive in
        return sum(j.gpus * j.work_s for j in jobs) / (200 * horizon * 0.85)

    # more, shorter arrivals carry the same 55% of the cluster's GPU-hours
    assert len(mixed) > 1.25 * len(plain)
    assert offered(mixed) == pytest.approx(0.55, rel=0.1)
    assert offered(plain) == pytest.approx(0.55, rel=0.1)
    with pytest.raises(ValueError, match="short_fraction"):
        synthetic_jobs(seed=seed, total_gpus=200, horizon_s=horizon, short_fraction=1.0)
