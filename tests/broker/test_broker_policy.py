"""The broker policy, table-driven over snapshots: it is a pure function, so each row is
a replayable situation and the decision it must give."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tideflow.broker import Action, Forecast, GangView, PolicyConfig, Snapshot, decide

CONFIG = PolicyConfig(
    total_gpus=200,
    per_gpu_rps=25.0,
    node_gpus=8,
    headroom=0.0,
    min_inference_gpus=8,
    cooldown_s=3600,
)


def forecast(rps: float | None) -> Forecast:
    return Forecast(rps, rps, rps, "test" if rps is not None else "none")


def snap(**changes: object) -> Snapshot:
    base = Snapshot(
        now_s=100_000.0,
        inference_gpus=80,
        measured_rps=1500.0,  # needs 60 GPUs
        forecast=forecast(1600.0),  # wants 64
        idle_training_gpus=0,
        gangs=(
            GangView("big-lowprio", 64, priority=0, last_checkpoint_s=99_000.0),
            GangView("small-lowprio-fresh", 16, priority=0, last_checkpoint_s=99_900.0),
            GangView("small-lowprio-stale", 16, priority=0, last_checkpoint_s=98_000.0),
            GangView("high", 24, priority=5, last_checkpoint_s=99_990.0),
        ),
        last_lend_s=None,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


CASES = [
    # (name, snapshot, action, inference after, reclaimed gangs, reason contains)
    (
        "trough: lend whole nodes",
        snap(forecast=forecast(1000.0), measured_rps=900.0),
        Action.LEND,
        40,
        (),
        "lending 40 GPUs (5 whole node(s))",
    ),
    (
        "peak arrives: grow from idle first",
        snap(forecast=forecast(2400.0), idle_training_gpus=16),
        Action.GROW,
        96,
        (),
        "16 idle",
    ),
    (
        "peak beyond idle: least work lost first, whole gangs",
        snap(forecast=forecast(2400.0), idle_training_gpus=0),
        Action.GROW,
        96,
        ("small-lowprio-fresh",),
        "after a checkpoint",
    ),
    (
        "big peak: priority protects the high gang",
        snap(forecast=forecast(4000.0)),
        Action.GROW,
        160,
        ("small-lowprio-fresh", "big-lowprio"),
        "reclaiming",
    ),
    (
        "data gap with a low forecast: never lend on a silent metric",
        snap(measured_rps=None, forecast=forecast(500.0)),
        Action.HOLD,
        80,
        (),
        "data gap",
    ),
    (
        "data gap and no forecast: hold",
        snap(measured_rps=None, forecast=forecast(None)),
        Action.HOLD,
        80,
        (),
        "no load data",
    ),
    (
        "spike beyond the forecast: emergency growth",
        snap(measured_rps=2500.0, forecast=forecast(1600.0), idle_training_gpus=8),
        Action.GROW,
        104,
        ("small-lowprio-fresh",),
        "measured load needs 100",
    ),
    (
        "surplus under the margin: hold (hysteresis)",
        snap(forecast=forecast(1900.0)),  # wants 76 -> 80 in whole nodes: no surplus
        Action.HOLD,
        80,
        (),
        "fit the load",
    ),
    (
        "lent recently: cool down",
        snap(forecast=forecast(1000.0), measured_rps=900.0, last_lend_s=99_000.0),
        Action.HOLD,
        80,
        (),
        "cooling down",
    ),
    (
        "floor: never below min_inference_gpus",
        snap(forecast=forecast(10.0), measured_rps=10.0),
        Action.LEND,
        8,
        (),
        "lending 72",
    ),
]


@pytest.mark.parametrize(
    ("name", "snapshot", "action", "after", "reclaimed", "reason"),
    CASES,
    ids=[c[0] for c in CASES],
)
def test_policy_table(  # noqa: PLR0917 - one parameter per table column
    name: str,
    snapshot: Snapshot,
    action: Action,
    after: int,
    reclaimed: tuple[str, ...],
    reason: str,
) -> None:
    decision = decide(snapshot, CONFIG)
    assert decision.action is action, decision.reason
    assert decision.inference_gpus == after, decision.reason
    assert tuple(r.gang_id for r in decision.reclaims) == reclaimed, decision.reason
    assert reason in decision.reason
    assert decide(snapshot, CONFIG) == decision  # pure: the same snapshot, the same decision


def test_lent_capacity_is_whole_nodes_so_a_big_gang_can_use_it() -> None:
    # Surplus of 44 GPUs: lend 40 (five whole nodes), not 44 across a partial node.
    decision = decide(
        snap(inference_gpus=120, forecast=forecast(1900.0), measured_rps=1800.0), CONFIG
    )
    assert decision.action is Action.LEND
    assert (120 - decision.inference_gpus) % CONFIG.node_gpus == 0
    assert decision.inference_gpus == 80


def test_reclaim_stops_the_fewest_gpus_that_cover_the_need() -> None:
    """Every stopped gang restarts on all its GPUs: 8 GPUs come from an 8-GPU gang, not a
    64-GPU one, even when the big gang checkpointed more recently."""
    gangs = (
        GangView("big-fresh", 64, last_checkpoint_s=99_990.0),
        GangView("small-stale", 8, last_checkpoint_s=98_000.0),
        GangView("mid", 16, last_checkpoint_s=99_500.0),
        GangView("high-small", 8, priority=5, last_checkpoint_s=99_999.0),
    )
    need_8 = decide(snap(gangs=gangs, forecast=forecast(2200.0)), CONFIG)  # wants 88: +8
    assert [r.gang_id for r in need_8.reclaims] == ["small-stale"]
    need_24 = decide(snap(gangs=gangs, forecast=forecast(2600.0)), CONFIG)  # wants 104: +24
    assert sorted(r.gang_id for r in need_24.reclaims) == ["mid", "small-stale"]
    need_88 = decide(snap(gangs=gangs, forecast=forecast(4200.0)), CONFIG)  # wants 168: +88
    # all low-priority gangs give exactly 88: the high-priority gang keeps running
    assert sorted(r.gang_id for r in need_88.reclaims) == ["big-fresh", "mid", "small-stale"]


def test_elastic_gang_shrinks_to_its_minimum_instead_of_stopping() -> None:
    gangs = (GangView("elastic", 32, min_gpus=16, last_checkpoint_s=99_000.0),)
    decision = decide(snap(gangs=gangs, forecast=forecast(2200.0)), CONFIG)  # wants 88: +8
    (reclaim,) = decision.reclaims
    assert reclaim.gang_id == "elastic" and not reclaim.evicted and reclaim.gpus == 8


def test_flapping_load_lends_at_most_once_per_cooldown() -> None:
    inference, last_lend, lends = 160, None, 0
    for minute in range(0, 6 * 60, 10):  # six hours of load jumping between two levels
        rate = 3500.0 if (minute // 10) % 2 else 1200.0
        s = snap(
            now_s=100_000.0 + minute * 60,
            inference_gpus=inference,
            measured_rps=rate,
            forecast=forecast(rate),
            gangs=(),
            idle_training_gpus=200 - inference,
            last_lend_s=last_lend,
        )
        decision = decide(s, CONFIG)
        if decision.action is Action.LEND:
            lends += 1
            last_lend = s.now_s
        inference = decision.inference_gpus
    assert lends <= 6  # one per hour at most


def test_bad_configuration_is_refused_with_every_problem_named() -> None:
    with pytest.raises(ValueError) as info:
        PolicyConfig(total_gpus=100, per_gpu_rps=0, node_gpus=8, min_inference_gpus=120)
    text = str(info.value)
    assert "per_gpu_rps must be > 0" in text and "node_gpus must divide" in text
    assert "min_inference_gpus" in text
