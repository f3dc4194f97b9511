"""The running broker spends training's unspent lost-work budget on lending, as the
simulator measures it (``calibrate.LostWorkBudget``): the work training did and lost
comes from the local ledger's usage record, over the past week.

A real ledger on a declared inventory with its clock set by the test; no gangs run
(the stops are the ledger's own records: an eviction then a release, as the broker
and the gang layer do them; ``test_broker_local`` runs real gangs through it).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from tests.fakes import Clock, WindowedLoad
from tideflow.broker import PolicyConfig
from tideflow.broker.journal import DecisionJournal
from tideflow.broker.local import LocalActuator
from tideflow.broker.service import (
    BUDGET_S,
    BrokerSettings,
    lend_bound,
    observe,
    policy_config,
    rebalance_once,
)
from tideflow.inventory import Inventory, Node
from tideflow.scheduling import GangRequest, Lease, LeaseLedger

DAY = 86400.0
CONFIG = PolicyConfig(total_gpus=4, per_gpu_rps=10.0, node_gpus=1, min_inference_gpus=0)


FLAT = WindowedLoad(10.0, ended_only=True)  # a steady load: 10 rps in every 10-minute window


def lab(tmp_path: Path) -> tuple[LeaseLedger, LocalActuator, Clock]:
    clock = Clock(1_000_000.0)
    nodes = tuple(Node(f"n{i}", 8, "gpu", "T4", 1) for i in range(4))
    ledger = LeaseLedger(
        tmp_path / "leases.db", Inventory("lab", nodes, declared=True), clock=clock
    )
    return ledger, LocalActuator(ledger, None, node_gpus=1), clock


def run(ledger: LeaseLedger, clock: Clock, gang: str, gpus: int, *, hours: float, how: str) -> None:
    """A gang holds ``gpus`` GPUs for ``hours`` and then ends: released, preempted
    (stopped after its checkpoint) or forced (its last hour lost)."""
    lease = ledger.try_acquire(GangRequest(gang, "default", "gpu", None, gpus, 1), "op", 1e9)
    assert isinstance(lease, Lease), lease
    clock.now += hours * 3600
    if how != "released":
        assert ledger.evict(gang, "broker/inference", "reclaimed for inference", 300.0)
    ledger.release(lease.lease_id, lost_s=3600.0 if how == "forced" else 0.0)


def test_under_budget_the_lend_bound_shrinks_to_its_floor(tmp_path: Path) -> None:
    ledger, actuator, clock = lab(tmp_path)
    run(
        ledger, clock, "a", 4, hours=24, how="released"
    )  # a day of the whole lab trained, nothing lost
    bound = lend_bound(FLAT, actuator, CONFIG, clock.now)
    # budget 1% of 96 GPU-h, a day's budget of the lab is 0.96 GPU-h: margin -1 -> floor
    assert bound is not None and bound.margin == pytest.approx(-0.25)
    assert "lost work 0.0 of a 1.0 GPU-h budget" in bound.reason
    assert "lend bound x0.78" in bound.reason


def test_each_stop_costs_its_checkpoint_and_restart_and_a_forced_one_its_lost_work(
    tmp_path: Path,
) -> None:
    ledger, actuator, clock = lab(tmp_path)
    run(ledger, clock, "a", 4, hours=24, how="released")
    run(ledger, clock, "b", 2, hours=1, how="preempted")  # 2 GPUs x 360 s: 0.2 GPU-h
    work = actuator.training_work(clock.now - BUDGET_S, clock.now)
    assert (work.stopped_gpus, work.recorded_lost_gpu_s) == (2, 0.0)
    assert work.trained_gpu_s == pytest.approx((96 + 2) * 3600)
    under = lend_bound(FLAT, actuator, CONFIG, clock.now)
    assert under is not None
    # (0.2 - 0.98) GPU-h over the 0.96 GPU-h scale: -0.81, still the floor
    assert under.margin == pytest.approx(-0.25)

    run(ledger, clock, "c", 2, hours=2, how="forced")  # 2 GPU-h lost + 0.2 GPU-h of restarts
    over = lend_bound(FLAT, actuator, CONFIG, clock.now)
    assert over is not None and over.margin == 0.0  # over budget: the fixed bound
    assert "lost work 2.4 of a 1.0 GPU-h budget" in over.reason
    assert "lend bound x1.00" in over.reason


def test_the_budget_weighs_the_past_week_only(tmp_path: Path) -> None:
    ledger, actuator, clock = lab(tmp_path)
    run(ledger, clock, "a", 4, hours=24, how="released")
    run(ledger, clock, "c", 2, hours=2, how="forced")
    clock.now += BUDGET_S + 1  # a week later: neither the training nor the loss counts
    work = actuator.training_work(clock.now - BUDGET_S, clock.now)
    assert (work.trained_gpu_s, work.stopped_gpus, work.recorded_lost_gpu_s) == (0.0, 0, 0.0)
    assert lend_bound(FLAT, actuator, CONFIG, clock.now) is None  # the fixed bound


def test_the_inference_reservations_are_not_training(tmp_path: Path) -> None:
    _, actuator, clock = lab(tmp_path)
    journal = DecisionJournal(tmp_path / "broker.db")
    rebalance_once(FLAT, actuator, CONFIG, journal, now_s=clock.now)
    assert actuator.inference_gpus() > 0
    clock.now += DAY
    assert actuator.training_work(clock.now - BUDGET_S, clock.now).trained_gpu_s == 0.0


def test_the_lend_forecast_is_scaled_and_the_decision_says_so(tmp_path: Path) -> None:
    ledger, actuator, clock = lab(tmp_path)
    run(ledger, clock, "a", 4, hours=24, how="released")
    journal = DecisionJournal(tmp_path / "broker.db")
    fixed = observe(FLAT, actuator, CONFIG, journal, clock.now)
    spent = observe(FLAT, actuator, CONFIG, journal, clock.now, lend_margin=-0.25)
    assert fixed.lend_forecast is not None and spent.lend_forecast is not None
    assert fixed.lend_forecast.upper is not None and spent.lend_forecast.upper is not None
    assert spent.lend_forecast.upper == pytest.approx(fixed.lend_forecast.upper * math.exp(-0.25))
    assert spent.forecast == fixed.forecast  # the next window's bound is the SLO's, untouched

    decision, _ = rebalance_once(FLAT, actuator, CONFIG, journal, now_s=clock.now)
    assert "lend bound x0.78" in decision.reason
    (entry,) = journal.since(0)
    assert entry.reason == decision.reason


def test_no_budget_is_the_fixed_bound(tmp_path: Path) -> None:
    ledger, actuator, clock = lab(tmp_path)
    run(ledger, clock, "a", 4, hours=24, how="released")
    fixed = PolicyConfig(
        total_gpus=4, per_gpu_rps=10.0, node_gpus=1, min_inference_gpus=0, lost_work_budget=None
    )
    assert lend_bound(FLAT, actuator, fixed, clock.now) is None
    decision, _ = rebalance_once(
        FLAT, actuator, fixed, DecisionJournal(tmp_path / "b.db"), now_s=clock.now
    )
    assert "lend bound" not in decision.reason


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEFLOW_BROKER_LOAD", "synthetic:10")
    monkeypatch.setenv("TIDEFLOW_BROKER_PER_GPU_RPS", "10")
    settings = BrokerSettings.from_env()
    assert settings is not None
    assert (settings.lost_work_budget, settings.stop_cost_s) == (0.01, 360.0)
    monkeypatch.setenv("TIDEFLOW_BROKER_LOST_WORK_BUDGET", "none")
    monkeypatch.setenv("TIDEFLOW_BROKER_STOP_COST_S", "120")
    settings = BrokerSettings.from_env()
    assert settings is not None
    config = policy_config(settings, 16)
    assert (config.lost_work_budget, config.stop_cost_s) == (None, 120.0)
    for name, bad, says in (
        ("LOST_WORK_BUDGET", "1.5", "within (0, 1)"),
        ("LOST_WORK_BUDGET", "lots", "LOST_WORK_BUDGET='lots': accepted: a share"),
        ("STOP_COST_S", "-1", "seconds >= 0"),
    ):
        monkeypatch.setenv(f"TIDEFLOW_BROKER_{name}", bad)
        with pytest.raises(ValueError, match=re.escape(says)):
            BrokerSettings.from_env()
        monkeypatch.delenv(f"TIDEFLOW_BROKER_{name}")


def test_the_policy_refuses_a_budget_that_is_not_a_share() -> None:
    with pytest.raises(ValueError, match=r"lost_work_budget must be a share within \(0, 1\)"):
        PolicyConfig(total_gpus=4, per_gpu_rps=10.0, node_gpus=1, lost_work_budget=2.0)
