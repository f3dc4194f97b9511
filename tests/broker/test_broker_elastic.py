"""Elastic gangs: several shrink together before any gang is stopped; in the simulator a
shrunk gang keeps running at a speed in proportion to its GPUs (restart-based, as on the
local backend) and grows back when the GPUs are free; streams and job files carry the
elastic minimum."""

from __future__ import annotations

from pathlib import Path

from tideflow.broker import (
    Forecast,
    GangView,
    PolicyConfig,
    Snapshot,
    decide,
    load_jobs,
    synthetic_jobs,
)

CONFIG = PolicyConfig(total_gpus=200, per_gpu_rps=25.0, headroom=0.0, cooldown_s=3600)


def test_two_elastic_gangs_shrink_together_instead_of_one_being_stopped() -> None:
    gangs = (
        GangView("elastic-a", 32, last_checkpoint_s=0.0, min_gpus=24),
        GangView("elastic-b", 32, last_checkpoint_s=0.0, min_gpus=16),
        GangView("rigid", 16, last_checkpoint_s=0.0),
    )
    rate = 2600.0  # wants 104 GPUs: +24, more than either gang can give alone
    snapshot = Snapshot(
        1000.0, 80, rate, Forecast(rate, rate, rate, "test"), idle_training_gpus=0, gangs=gangs
    )
    decision = decide(snapshot, CONFIG)
    assert decision.inference_gpus == 104
    assert {(r.gang_id, r.gpus, r.evicted) for r in decision.reclaims} == {
        ("elastic-b", 16, False),
        ("elastic-a", 8, False),
    }


def test_what_shrinks_cannot_give_is_taken_by_stopping_the_fewest_gpus() -> None:
    gangs = (
        GangView("elastic", 32, last_checkpoint_s=0.0, min_gpus=24),
        GangView("rigid-8", 8, last_checkpoint_s=0.0),
        GangView("rigid-64", 64, last_checkpoint_s=0.0),
    )
    rate = 2400.0  # wants 96: +16 = 8 by shrinking + one 8-GPU gang stopped
    snapshot = Snapshot(
        1000.0, 80, rate, Forecast(rate, rate, rate, "test"), idle_training_gpus=0, gangs=gangs
    )
    reclaims = {(r.gang_id, r.gpus, r.evicted) for r in decide(snapshot, CONFIG).reclaims}
    assert reclaims == {("elastic", 8, False), ("rigid-8", 8, True)}


def test_streams_and_job_files_carry_the_elastic_minimum(tmp_path: Path) -> None:
    rigid = synthetic_jobs(seed=4, total_gpus=200, horizon_s=86400 * 3)
    mixed = synthetic_jobs(seed=4, total_gpus=200, horizon_s=86400 * 3, elastic_fraction=1.0)
    assert [(j.submit_s, j.gpus) for j in rigid] == [(j.submit_s, j.gpus) for j in mixed]
    assert all(j.min_gpus is None for j in rigid)
    assert all(j.min_gpus == j.gpus // 2 for j in mixed if j.gpus >= 16)
    path = tmp_path / "jobs.csv"
    path.write_text(
        "submit_s,gpus,duration_s,checkpoint_every_s,priority,min_gpus\n"
        "0,32,3600,600,0,16\n60,8,3600,600,1,\n"
    )
    assert [j.min_gpus for j in load_jobs(path)] == [16, None]
