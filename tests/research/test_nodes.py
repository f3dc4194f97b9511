"""The simulator placing gangs and inference on nodes (``research.broker.nodes``):
fragmentation keeps a gang waiting that counting GPUs would start, inference grows
only onto whole empty nodes and stops the gangs on the cheapest ones when the
policy's victims leave too few, and with whole-node gangs placing and counting agree.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from research.broker.nodes import NodePool
from research.broker.simulate import ResearchConfig, simulate
from tideflow.broker import SyntheticLoad, synthetic_jobs
from tideflow.broker.jobs import JobSpec
from tideflow.broker.load import LoadSample

pytestmark = pytest.mark.research

DAYS = 3


def test_whole_node_gangs_take_empty_nodes_and_small_ones_the_fullest_node() -> None:
    pool = NodePool(3, 8)
    assert pool.place("big", 16) and set(pool.placed["big"]) == {0, 1}
    assert pool.place("a", 3) and pool.placed["a"] == {2: 3}
    assert pool.place("b", 4) and pool.placed["b"] == {2: 4}  # packed beside a
    assert not pool.place("c", 2)  # one GPU left anywhere
    pool.release("big")
    assert pool.place("c", 2) and pool.placed["c"] == {0: 2}
    assert pool.free == [6, 8, 1]


def test_free_gpus_spread_over_nodes_do_not_hold_a_gang() -> None:
    pool = NodePool(2, 8)
    assert pool.place("a", 6) and pool.place("b", 6)
    assert sum(pool.free) == 4 and not pool.place("four", 4)  # counted, it would fit


def test_inference_grows_onto_empty_nodes_only_and_lends_its_highest() -> None:
    pool = NodePool(4, 8)
    assert pool.place("a", 2)  # node 0 is no longer empty
    assert pool.inference_to(24) == 24 and pool.inference == {1, 2, 3}
    assert pool.inference_to(32) == 24  # node 0 holds a gang
    assert not pool.place("b", 8)  # no training node is empty
    assert pool.inference_to(8) == 8 and pool.inference == {1}
    assert pool.place("b", 8) and pool.placed["b"] == {2: 8}


def test_emptying_nodes_stops_the_gangs_on_the_cheapest() -> None:
    pool = NodePool(3, 8)
    for gang, gpus in (("wide", 12), ("x", 2), ("y", 2)):
        assert pool.place(gang, gpus)
    # wide: node 0 (8) + node 1 (4); x and y packed beside it on node 1; node 2 empty
    assert pool.placed["x"] == {1: 2} and pool.placed["y"] == {1: 2}
    costs = {"wide": 1e6, "x": 1.0, "y": 1.0}
    assert pool.to_empty(1, costs) == []  # node 2 is empty already
    assert pool.to_empty(2, costs) == ["wide"]  # node 0 is wide's alone
    assert pool.to_empty(3, costs) == ["wide", "x", "y"]


def test_the_cheapest_node_is_emptied_first() -> None:
    pool = NodePool(3, 8)
    for gang, gpus in (("p", 8), ("x", 2), ("y", 2)):
        assert pool.place(gang, gpus)
    assert pool.placed == {"p": {0: 8}, "x": {1: 2}, "y": {1: 2}}
    assert pool.to_empty(2, {"p": 100.0, "x": 1.0, "y": 1.0}) == ["x", "y"]
    assert pool.to_empty(2, {"p": 1.0, "x": 100.0, "y": 1.0}) == ["p"]


def test_an_elastic_gang_shrinks_where_it_holds_least_and_grows_back_on_its_nodes() -> None:
    pool = NodePool(2, 8)
    assert pool.place("e", 12) and pool.placed["e"] == {0: 8, 1: 4}
    assert pool.resize("e", 8) and pool.placed["e"] == {0: 8}
    assert pool.place("s", 6) and pool.placed["s"] == {1: 6}
    assert not pool.resize("e", 12)  # two GPUs free
    assert pool.resize("e", 10) and pool.placed["e"] == {0: 8, 1: 2}


class Flat:
    window_s = 600.0

    def __init__(self, rps: float) -> None:
        self.rps = rps

    def samples(self, start_s: float, end_s: float) -> list[LoadSample]:
        first = int(start_s // 600)
        return [LoadSample(i * 600.0, self.rps) for i in range(first, int(end_s // 600))]


def _job(job_id: str, gpus: int, submit_s: float = 0.0) -> JobSpec:
    return JobSpec(job_id, submit_s, gpus, 3600.0 * 10, 1800.0)


def test_the_simulator_keeps_a_gang_waiting_on_fragmented_nodes() -> None:
    jobs = [_job("a", 6), _job("b", 6), _job("four", 4)]
    counted = ResearchConfig(policy="static:0", total_gpus=16, node_gpus=8)
    placed = replace(counted, placement="nodes")
    by_count = simulate(Flat(0.0), jobs, counted, start_s=0, end_s=7200)
    by_node = simulate(Flat(0.0), jobs, placed, start_s=0, end_s=7200)
    assert by_count.windows[0].training_gpus == 16
    assert by_node.windows[0].training_gpus == 12
    assert by_node.metrics["mean_queueing_hours"] > by_count.metrics["mean_queueing_hours"]


def test_on_a_stream_of_small_gangs_victims_chosen_by_node_empty_the_nodes() -> None:
    """Gangs of 1-32 GPUs (a seeded stream) on a diurnal load. Victims chosen by count
    often leave too few empty nodes, and the simulator stops the gangs on the cheapest
    nodes as well; a policy that sees the gangs' nodes chooses victims that empty them.
    Nodes are never over-committed."""
    load = SyntheticLoad(mean_rps=2000, daily_amplitude=0.5, seed=11)
    jobs = synthetic_jobs(
        seed=3,
        total_gpus=200,
        horizon_s=DAYS * 86400,
        sizes=(1, 2, 4, 8, 16, 32),
        weights=(0.2, 0.2, 0.2, 0.2, 0.1, 0.1),
    )
    config = ResearchConfig(policy="tidal", per_gpu_rps=25.0, placement="nodes")
    by_count = simulate(
        load, jobs, replace(config, node_aware=False), start_s=0, end_s=DAYS * 86400
    )
    by_node = simulate(load, jobs, config, start_s=0, end_s=DAYS * 86400)
    assert by_count.metrics["placement_preemptions"] > 0
    assert by_count.metrics["preemptions"] >= by_count.metrics["placement_preemptions"]
    assert by_node.metrics["placement_preemptions"] == 0
    assert by_node.metrics["preemptions"] > 0
    for result in (by_count, by_node):
        for window in result.windows:
            assert window.inference_gpus % 8 == 0
            assert window.inference_gpus + window.training_gpus <= 200


def test_with_whole_node_gangs_placing_and_counting_agree() -> None:
    load = SyntheticLoad(mean_rps=2000, daily_amplitude=0.5, seed=11)
    jobs = synthetic_jobs(seed=3, total_gpus=200, horizon_s=DAYS * 86400)  # 8-64 GPUs
    for policy in ("tidal", "static:136", "oracle", "cron:0.2"):
        config = ResearchConfig(policy=policy, per_gpu_rps=25.0)
        counted = simulate(load, jobs, config, start_s=0, end_s=DAYS * 86400).metrics
        placed = simulate(
            load, jobs, replace(config, placement="nodes"), start_s=0, end_s=DAYS * 86400
        ).metrics
        assert placed.pop("placement_preemptions") == 0
        assert placed == counted, policy


def test_bad_placement_is_refused() -> None:
    with pytest.raises(ValueError, match="use 'gpus' \\(counted\\) or 'nodes'"):
        ResearchConfig(policy="tidal", placement="racks")
    with pytest.raises(ValueError, match="not whole nodes of 8"):
        ResearchConfig(policy="tidal", total_gpus=20, placement="nodes")


def test_placing_on_nodes_reports_the_placement_preemptions() -> None:
    """What ``bench/broker.py --placement nodes`` reads: the gangs stopped only to empty
    nodes, reported where gangs are placed and absent where GPUs are counted."""
    load = SyntheticLoad(mean_rps=2000, seed=0)
    jobs = synthetic_jobs(seed=0, total_gpus=200, horizon_s=2 * 86400)
    config = ResearchConfig(policy="tidal", per_gpu_rps=25.0)
    placed = simulate(load, jobs, replace(config, placement="nodes"), start_s=0, end_s=2 * 86400)
    assert "placement_preemptions" in placed.to_json()
    counted = simulate(load, jobs, config, start_s=0, end_s=2 * 86400)
    assert "placement_preemptions" not in counted.to_json()


def test_a_gang_spanning_nodes_empties_them_all_at_once() -> None:
    pool = NodePool(4, 8)
    assert pool.place("wide", 16) and pool.place("a", 4) and pool.place("b", 4)
    assert pool.placed["wide"] == {0: 8, 1: 8}
    # wide is the cheapest; stopping it empties two nodes: nothing more is stopped
    assert pool.to_empty(2, {"wide": 1.0, "a": 5.0, "b": 5.0}) == ["wide"]
