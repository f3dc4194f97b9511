"""What the oracle and hindsight bounds keep of tidal besides its forecast
(``SimulationConfig.bound_mechanics``): "lean" (no cooldown, a lend bound read from
their own bounds ahead), "cooldown", "lend" (tidal's lend bound from the past, with
its lost-work budget) or "tidal" (both). ``bench/broker.py --decompose`` uses them to
split the gap between tidal and the oracle into its forecast's share and its
mechanics' share.

Pure simulation on a seeded synthetic load: no server is involved.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from research.broker.bounds import MECHANICS
from research.broker.simulate import ResearchConfig, simulate
from tideflow.broker import SyntheticLoad, synthetic_jobs
from tideflow.broker.simulation import SimulationResult

pytestmark = pytest.mark.research

DAY = 86400.0
LOAD = SyntheticLoad(mean_rps=2000, seed=11)
JOBS = synthetic_jobs(seed=2, total_gpus=200, horizon_s=4 * DAY)


def _run(policy: str, **overrides: Any) -> SimulationResult:
    config = ResearchConfig(policy=policy, per_gpu_rps=25.0, **overrides)
    return simulate(LOAD, JOBS, config, start_s=0, end_s=4 * DAY)


def _lend_gaps(result: SimulationResult) -> list[float]:
    lends = [w.start_s for w in result.windows if w.action == "lend"]
    return [b - a for a, b in itertools.pairwise(lends)]


@pytest.fixture(scope="module")
def oracle_runs() -> dict[str, SimulationResult]:
    return {mechanics: _run("oracle", bound_mechanics=mechanics) for mechanics in MECHANICS}


def test_with_tidals_cooldown_the_oracle_waits_between_lends(
    oracle_runs: dict[str, SimulationResult],
) -> None:
    """Lean, the oracle lends again within the hour on this load; keeping tidal's
    cooldown (alone or with its lend bound), it never does."""
    assert min(_lend_gaps(oracle_runs["lean"])) < 3600.0
    assert min(_lend_gaps(oracle_runs["lend"])) < 3600.0
    for mechanics in ("cooldown", "tidal"):
        gaps = _lend_gaps(oracle_runs[mechanics])
        assert gaps and min(gaps) >= 3600.0, mechanics


def test_with_tidals_lend_bound_the_oracle_holds_more_and_still_covers_every_window(
    oracle_runs: dict[str, SimulationResult],
) -> None:
    """Tidal's lend bound, read from the past, keeps GPUs the exact next-window load
    does not need; the next window's load is still known, so the only windows missed
    are those needing more than the whole cluster: what the mechanics cost is
    training's, not the SLO's."""
    lean = oracle_runs["lean"].metrics
    for mechanics in ("lend", "tidal"):
        kept = oracle_runs[mechanics].metrics
        assert kept["mean_inference_gpus"] > lean["mean_inference_gpus"], mechanics
        assert kept["training_goodput_gpu_hours"] < lean["training_goodput_gpu_hours"]
    for result in oracle_runs.values():
        missed = [w for w in result.windows if w.needed and w.inference_gpus < w.needed]
        assert all(w.needed > 200 and w.inference_gpus == 200 for w in missed)
        assert len(missed) <= 2


def test_tidals_lend_bound_spends_the_lost_work_budget_as_tidals_does(
    oracle_runs: dict[str, SimulationResult],
) -> None:
    """Kept by a bound, tidal's lend bound is scaled by the lost-work budget, as tidal's
    is: without the budget the same bound holds more GPUs; lean, there is no budget."""
    fixed = _run("oracle", bound_mechanics="lend", lost_work_budget=None).metrics
    spending = oracle_runs["lend"].metrics
    assert "lost_work_budget_gpu_hours" in spending
    assert "lost_work_budget_gpu_hours" not in oracle_runs["lean"].metrics
    assert "lost_work_budget_gpu_hours" not in fixed
    assert spending["mean_inference_gpus"] < fixed["mean_inference_gpus"]


def test_the_hindsight_bound_keeps_each_mechanism_alone_or_both() -> None:
    """With "lend" the hindsight bound lends within tidal's lend bound (holding more) but
    without the cooldown; with "cooldown", its own lend bound and tidal's cooldown; with
    "tidal", both. Lean is the default."""
    lean = _run("oracle-hindsight-cross")
    lend = _run("oracle-hindsight-cross", bound_mechanics="lend")
    cooldown = _run("oracle-hindsight-cross", bound_mechanics="cooldown")
    both = _run("oracle-hindsight-cross", bound_mechanics="tidal")
    assert ResearchConfig(policy="oracle-hindsight-cross").bound_mechanics == "lean"
    for kept in (lend, both):
        assert kept.metrics["mean_inference_gpus"] > lean.metrics["mean_inference_gpus"]
        assert "lost_work_budget_gpu_hours" in kept.metrics
    assert min(_lend_gaps(lend)) < 3600.0
    for kept in (cooldown, both):
        assert min(_lend_gaps(kept)) >= 3600.0 > min(_lend_gaps(lean))
    assert "lost_work_budget_gpu_hours" not in cooldown.metrics


@pytest.mark.parametrize(
    ("policy", "mechanics", "message"),
    [
        ("oracle", "cooldwn", r"bound_mechanics 'cooldwn': use one of 'lean', 'cooldown'"),
        ("tidal", "tidal", r"applies to the policies 'oracle', .* only \(got policy 'tidal'\)"),
        ("oracle-burst-blind", "lend", r"only \(got policy 'oracle-burst-blind'\)"),
        ("static:80", "cooldown", r"only \(got policy 'static:80'\)"),
    ],
)
def test_a_bad_mechanics_names_what_is_accepted(policy: str, mechanics: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ResearchConfig(policy=policy, bound_mechanics=mechanics)


def test_the_result_names_the_mechanics_the_bound_kept() -> None:
    """A split of a user's own trace reads back which mechanics the bound kept."""
    short = ResearchConfig(policy="oracle", per_gpu_rps=25.0, bound_mechanics="tidal")
    kept = simulate(LOAD, JOBS, short, start_s=0, end_s=DAY).to_json()
    assert kept["config"]["bound_mechanics"] == "tidal"
    lean = simulate(LOAD, JOBS, replace(short, bound_mechanics="lean"), start_s=0, end_s=DAY)
    assert lean.to_json()["config"]["bound_mechanics"] == "lean"
