"""The policy and the local broker seeing nodes: victims chosen to empty whole nodes, and
inference growing onto a node the broker empties rather than onto idle GPUs spread over
several."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tests.broker.test_broker_journal_held import CONFIG
from tests.fakes import WindowedLoad
from tideflow.broker.journal import DecisionJournal
from tideflow.broker.local import LocalActuator
from tideflow.broker.service import rebalance_once
from tideflow.inventory import Inventory, Node
from tideflow.scheduling import GangRequest, Lease, LeaseLedger


def test_the_policy_chooses_victims_that_empty_a_node_when_it_sees_the_nodes() -> None:
    """Inference needs one more node and no node is empty: 4 GPUs are idle, spread over
    two nodes. By count the cheapest victim frees 4 GPUs on a node another gang keeps;
    seeing the nodes, the policy stops the gangs of one whole node."""
    from tideflow.broker import Action, Forecast, PolicyConfig, Snapshot, decide
    from tideflow.broker.policy import GangView

    config = PolicyConfig(total_gpus=32, per_gpu_rps=10.0, node_gpus=8, headroom=0.0)
    gangs = (
        GangView("x", 4, 0, 0.0, None, ("n1",)),  # old checkpoints: costly to stop
        GangView("y", 4, 0, 0.0, None, ("n1",)),
        GangView("p", 4, 0, 990.0, None, ("n2",)),  # just checkpointed: cheap
        GangView("q", 2, 0, 900.0, None, ("n2",)),
        GangView("r", 6, 0, 900.0, None, ("n3",)),
    )
    counted = Snapshot(1000.0, 8, 160.0, Forecast(160.0, 160.0, 160.0, "t"), 4, gangs)
    placed = replace(counted, empty_nodes=0)
    by_count, by_node = decide(counted, config), decide(placed, config)
    assert by_count.action is by_node.action is Action.GROW
    assert [r.gang_id for r in by_count.reclaims] == ["p"]  # n2 keeps q: no empty node
    stopped = {r.gang_id for r in by_node.reclaims}
    nodes = {"n1": {"x", "y"}, "n2": {"p", "q"}, "n3": {"r"}}
    assert any(gangs_on <= stopped for gangs_on in nodes.values())
    assert by_node.inference_gpus == 16


def test_the_local_broker_grows_onto_a_node_it_empties_not_onto_spread_idle_gpus(
    tmp_path: Path,
) -> None:
    """Four nodes of 2 GPUs; inference holds one. Two 1-GPU gangs sit on two nodes, one
    GPU idle beside each: 2 GPUs idle by count, no node empty. The load then needs a
    second node. Choosing victims by count (none: 2 GPUs are idle) the reservation
    could not be placed; seeing the nodes, the broker stops the gang of one node."""
    nodes = tuple(Node(f"n{i}", 8, "gpu", "T4", 2) for i in range(4))
    ledger = LeaseLedger(tmp_path / "leases.db", Inventory("lab", nodes, declared=True))
    actuator = LocalActuator(ledger, None, node_gpus=2, poll_s=0.01)
    config = replace(CONFIG, total_gpus=8, node_gpus=2, min_inference_gpus=2)
    journal = DecisionJournal(tmp_path / "broker.db")
    rebalance_once(WindowedLoad(12.0, ended_only=True), actuator, config, journal, now_s=7200.0)
    assert actuator.inference_gpus() == 2
    held = {}
    for gang in ("a", "x", "b", "y"):  # packed: a, x on one node; b, y on another
        lease = ledger.try_acquire(GangRequest(gang, "default", "gpu", None, 1, 1), "op", 1e9)
        assert isinstance(lease, Lease)
        held[gang] = lease
    for gang in ("x", "y"):
        ledger.release(held[gang].lease_id)
    assert actuator.idle_training_gpus() == 4 and actuator.empty_nodes() == 1
    filler = ledger.try_acquire(GangRequest("f", "default", "gpu", None, 1, 2), "op", 1e9)
    assert isinstance(filler, Lease)  # the empty node is taken too: 2 idle, spread
    assert actuator.idle_training_gpus() == 2 and actuator.empty_nodes() == 0

    decision, applied = rebalance_once(
        WindowedLoad(22.0, ended_only=True), actuator, config, journal, now_s=7800.0
    )
    assert decision.inference_gpus == 4 and applied is not None and applied.complete
    assert actuator.inference_gpus() == 4
    assert len(decision.reclaims) == 1 and decision.reclaims[0].gang_id in {"a", "b"}


def test_one_observation_reads_the_leases_once(tmp_path: Path) -> None:
    """What a step asks of the ledger (inference's GPUs, the idle ones, the pinned nodes,
    the gangs) is answered from one read of the leases, so the answers agree: the old
    code read them once per question, four times in this step."""
    from tideflow.broker.service import peek

    nodes = tuple(Node(f"n{i}", 8, "gpu", "T4", 2) for i in range(4))
    ledger = LeaseLedger(tmp_path / "leases.db", Inventory("lab", nodes, declared=True))
    lease = ledger.try_acquire(GangRequest("train", "vision", "gpu", None, 1, 2), "test", 600.0)
    assert isinstance(lease, Lease)
    reads = 0
    read_leases = ledger.leases

    def counted() -> list[Lease]:
        nonlocal reads
        reads += 1
        return read_leases()

    ledger.leases = counted  # type: ignore[method-assign]
    actuator = LocalActuator(ledger, None, node_gpus=2, poll_s=0.01)
    config = replace(CONFIG, total_gpus=8, node_gpus=2, min_inference_gpus=2)
    journal = DecisionJournal(tmp_path / "broker.db")
    peek(WindowedLoad(12.0, ended_only=True), actuator, config, journal, now_s=7200.0)
    assert reads == 1
    assert actuator.idle_training_gpus() == 6 and reads == 2  # outside one, read afresh
