"""Gang placement and the lease ledger, on declared inventories and a fake clock.

The scenarios are our users' first two pains: a gang scheduler that hands out
part of a gang deadlocks the cluster; fragmentation leaves 21 free GPUs that
no 2-node job can use.
"""

from __future__ import annotations

import multiprocessing
import random
import sqlite3
from pathlib import Path

import pytest

from tests.fakes import Clock
from tideflow.inventory import Inventory, Node
from tideflow.scheduling import (
    GangRequest,
    Lease,
    LeaseLedger,
    LeaseLostError,
    Refusal,
    WorkerPlacement,
    place,
)
from tideflow.scheduling.placement import nodes_to_hold, without_nodes


def cluster(*groups: tuple[str, int, str, int]) -> Inventory:
    """(name prefix, node count, model, GPUs per node) groups -> Inventory."""
    nodes = []
    for prefix, count, model, gpus in groups:
        nodes += [Node(f"{prefix}-{i}", 64, "gpu", model, gpus) for i in range(count)]
    return Inventory("test", tuple(nodes), declared=True)


def gang(
    gang_id: str, workers: int, per: int, *, model: str | None = "H100", priority: int = 0
) -> GangRequest:
    return GangRequest(gang_id, "team", "gpu", model, workers, per, priority)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def ledger(tmp_path: Path, inventory: Inventory, clock: Clock) -> LeaseLedger:
    return LeaseLedger(tmp_path / "leases.db", inventory, clock=clock)


def held(book: LeaseLedger) -> int:
    return sum(len(devices) for devices in book.used_devices().values())


def test_two_two_node_gangs_on_two_nodes_do_not_deadlock(tmp_path: Path, clock: Clock) -> None:
    book = ledger(tmp_path, cluster(("h100", 2, "H100", 8)), clock)
    first = book.try_acquire(gang("a", 2, 8), "worker-a", 60)
    second = book.try_acquire(gang("b", 2, 8), "worker-b", 60)
    assert isinstance(first, Lease) and first.nodes == ("h100-0", "h100-1")
    assert isinstance(second, Refusal) and not second.never
    assert held(book) == 16  # all of a's, none of b's: no partial hold
    assert [r.gang_id for r, _ in book.waiting()] == ["b"]
    book.release(first.lease_id)
    granted = book.try_acquire(gang("b", 2, 8), "worker-b", 60)
    assert isinstance(granted, Lease) and len(granted.placements) == 2
    assert book.waiting() == []


def test_fragmented_cluster_refuses_instead_of_holding_14_gpus(
    tmp_path: Path, clock: Clock
) -> None:
    book = ledger(tmp_path, cluster(("h100", 3, "H100", 8)), clock)
    # Best fit packs single GPUs onto one node, so build the seed's state on purpose:
    # three 7-GPU jobs, a 1-GPU job beside each, then the 7-GPU jobs finish.
    sevens = [book.try_acquire(gang(f"seven-{i}", 1, 7), "w", 60) for i in range(3)]
    for index in range(3):
        assert isinstance(book.try_acquire(gang(f"small-{index}", 1, 1), "w", 60), Lease)
    for lease in sevens:
        assert isinstance(lease, Lease)
        book.release(lease.lease_id)
    assert {n: len(d) for n, d in book.used_devices().items()} == {
        "h100-0/gpu": 1,
        "h100-1/gpu": 1,
        "h100-2/gpu": 1,
    }
    refusal = book.try_acquire(gang("big", 2, 8), "w", 60)
    assert isinstance(refusal, Refusal) and not refusal.never
    assert "21 free devices in total, but fragmented" in refusal.reason
    assert held(book) == 3


def test_small_jobs_pack_onto_the_fullest_node(tmp_path: Path, clock: Clock) -> None:
    book = ledger(tmp_path, cluster(("h100", 3, "H100", 8)), clock)
    leases = [book.try_acquire(gang(f"s{i}", 1, 1), "w", 60) for i in range(3)]
    assert [lease.nodes for lease in leases if isinstance(lease, Lease)] == [("h100-0",)] * 3
    big = book.try_acquire(gang("big", 2, 8), "w", 60)  # two whole nodes are still free
    assert isinstance(big, Lease) and big.nodes == ("h100-1", "h100-2")


def test_gang_is_never_split_across_models(tmp_path: Path, clock: Clock) -> None:
    inventory = cluster(("a100", 4, "A100", 4), ("v100", 4, "V100", 4))
    eight = place(gang("g", 8, 2, model=None), inventory, {})
    assert not isinstance(eight, Refusal)
    nodes = {p.node.split("-")[0] for p in eight}
    assert len(nodes) == 1  # all A100 or all V100, never both
    # 12 workers x 2 GPUs = 24 GPUs: 32 in the cluster, but only 16 of each model
    never = place(gang("g", 12, 2, model=None), inventory, {})
    assert isinstance(never, Refusal) and never.never
    book = ledger(tmp_path, inventory, clock)
    a = book.try_acquire(gang("a", 8, 2, model="A100"), "w", 60)
    assert isinstance(a, Lease) and {p.node[:4] for p in a.placements} == {"a100"}
    b = book.try_acquire(gang("b", 8, 2, model="A100"), "w", 60)
    assert isinstance(b, Refusal) and not b.never  # waits for A100s though V100s are free
    c = book.try_acquire(gang("c", 8, 2, model=None), "w", 60)
    assert isinstance(c, Lease) and {p.node[:4] for p in c.placements} == {"v100"}


def test_gang_larger_than_the_cluster_fails_fast(tmp_path: Path, clock: Clock) -> None:
    book = ledger(tmp_path, cluster(("h100", 2, "H100", 8)), clock)
    refusal = book.try_acquire(gang("huge", 3, 8), "w", 60)
    assert isinstance(refusal, Refusal) and refusal.never
    assert "can never be placed on cluster 'test'" in refusal.reason
    assert "room for at most 2 such worker(s)" in refusal.reason
    assert book.waiting() == []


@pytest.mark.parametrize(
    ("busy", "request_", "expected"),
    [
        # whole free nodes first for a multi-node gang
        (
            {"n-0": 2},
            (2, 8),
            [("n-1", (0, 1, 2, 3, 4, 5, 6, 7)), ("n-2", (0, 1, 2, 3, 4, 5, 6, 7))],
        ),
        # best fit: the fullest node that holds the rest
        ({"n-0": 6, "n-1": 2}, (1, 2), [("n-0", (6, 7))]),
        ({"n-0": 6, "n-1": 2}, (1, 4), [("n-1", (2, 3, 4, 5))]),
        # 12 GPUs: a whole node, then the best fit for the remaining 4
        ({"n-0": 4}, (3, 4), [("n-1", (0, 1, 2, 3)), ("n-1", (4, 5, 6, 7)), ("n-0", (4, 5, 6, 7))]),
    ],
)
def test_placement_table(
    busy: dict[str, int], request_: tuple[int, int], expected: list[tuple[str, tuple[int, ...]]]
) -> None:
    inventory = cluster(("n", 3, "H100", 8))
    used = {node: set(range(count)) for node, count in busy.items()}
    placed = place(gang("g", *request_), inventory, used)
    assert not isinstance(placed, Refusal)
    assert [(p.node, p.devices) for p in placed] == expected
    assert [p.rank for p in placed] == list(range(len(expected)))


def test_priority_decides_who_goes_first(tmp_path: Path, clock: Clock) -> None:
    book = ledger(tmp_path, cluster(("h100", 2, "H100", 8)), clock)
    blocker = book.try_acquire(gang("blocker", 2, 8), "w", 60)
    assert isinstance(blocker, Lease)
    low = book.try_acquire(gang("low", 1, 8, priority=0), "w", 60)
    clock.now += 1
    high = book.try_acquire(gang("high", 1, 8, priority=10), "w", 60)
    assert isinstance(low, Refusal) and isinstance(high, Refusal)
    book.release(blocker.lease_id)
    # one node frees up... both fit; the low-priority one polls first but must yield
    book.try_acquire(gang("x", 1, 8), "w", 60)  # a third party takes one node
    still_low = book.try_acquire(gang("low", 1, 8, priority=0), "w", 60)
    assert isinstance(still_low, Refusal) and "high waits ahead of it" in still_low.reason
    granted = book.try_acquire(gang("high", 1, 8, priority=10), "w", 60)
    assert isinstance(granted, Lease)


def test_a_waiter_that_does_not_fit_does_not_block_smaller_gangs(
    tmp_path: Path, clock: Clock
) -> None:
    book = ledger(tmp_path, cluster(("h100", 2, "H100", 8)), clock)
    assert isinstance(book.try_acquire(gang("half", 1, 8), "w", 60), Lease)
    big = book.try_acquire(gang("big", 2, 8, priority=100), "w", 60)
    assert isinstance(big, Refusal) and not big.never
    small = book.try_acquire(gang("small", 1, 4, priority=0), "w", 60)
    assert isinstance(small, Lease)  # best-effort FIFO: big cannot use the space anyway


def test_acquire_is_idempotent_per_gang(tmp_path: Path, clock: Clock) -> None:
    book = ledger(tmp_path, cluster(("h100", 2, "H100", 8)), clock)
    first = book.try_acquire(gang("g", 1, 8), "try-1", 60)
    again = book.try_acquire(gang("g", 1, 8), "try-2", 60)  # an Airflow retry
    assert isinstance(first, Lease) and isinstance(again, Lease)
    assert again.lease_id == first.lease_id and again.placements == first.placements
    assert held(book) == 8


def test_leases_expire_without_renewal(tmp_path: Path, clock: Clock) -> None:
    book = ledger(tmp_path, cluster(("h100", 1, "H100", 8)), clock)
    lease = book.try_acquire(gang("g", 1, 8), "w", 30)
    assert isinstance(lease, Lease)
    clock.now += 20
    renewed = book.renew(lease.lease_id, 30)
    assert renewed.expires_at == clock.now + 30
    clock.now += 31  # the holder died and stopped renewing
    assert book.lease_for("g") is None and held(book) == 0
    with pytest.raises(LeaseLostError):
        book.renew(lease.lease_id, 30)
    book.release(lease.lease_id)  # idempotent
    assert isinstance(book.try_acquire(gang("other", 1, 8), "w", 30), Lease)


def test_waiters_that_stop_polling_are_forgotten(tmp_path: Path, clock: Clock) -> None:
    book = ledger(tmp_path, cluster(("h100", 1, "H100", 8)), clock)
    assert isinstance(book.try_acquire(gang("holder", 1, 8), "w", 600), Lease)
    assert isinstance(book.try_acquire(gang("gone", 1, 8, priority=9), "w", 60), Refusal)
    clock.now += book.waiter_timeout_s + 1
    assert book.waiting() == []


def _hammer(path: str, seed: int, rounds: int) -> int:
    inventory = cluster(("h100", 3, "H100", 8))
    book = LeaseLedger(Path(path), inventory)
    rng = random.Random(seed)
    granted = 0
    for round_ in range(rounds):
        request = gang(f"p{seed}-{round_}", rng.choice([1, 2, 3]), rng.choice([1, 2, 4, 8]))
        result = book.try_acquire(request, f"proc-{seed}", 30)
        if isinstance(result, Lease):
            granted += 1
            if rng.random() < 0.7:
                book.release(result.lease_id)
    return granted


@pytest.mark.processes
def test_many_processes_never_double_book_a_device(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    LeaseLedger(path, cluster(("h100", 3, "H100", 8)))
    # spawn, not fork: forking a test process that already runs other threads (a jemalloc
    # background thread, an event loop) can hand the children a held lock and hang them.
    with multiprocessing.get_context("spawn").Pool(6) as pool:
        granted = pool.starmap(_hammer, [(str(path), seed, 25) for seed in range(6)])
    assert sum(granted) > 0
    db = sqlite3.connect(path)
    claims = db.execute("SELECT node, device, lease_id FROM claims").fetchall()
    leases = {row[0]: row[1] for row in db.execute("SELECT lease_id, placements FROM leases")}
    # the primary key on (node, class, device) made double booking impossible; check that
    # the claims are exactly the devices of the live leases
    expected = set()
    for lease_id, placements in leases.items():
        for placement in Lease.placements_from_json(placements):
            expected |= {(placement.node, device, lease_id) for device in placement.devices}
    assert set(claims) == expected
    assert len(claims) == len(expected) <= 24


def test_device_hours_per_team_count_released_expired_and_held_leases(
    tmp_path: Path, clock: Clock
) -> None:
    book = ledger(tmp_path, cluster(("h100", 2, "H100", 8)), clock)
    start = clock.now
    vision = book.try_acquire(GangRequest("v", "vision", "gpu", None, 2, 1, 0), "w", 7200)
    assert isinstance(vision, Lease)
    clock.now = start + 1800
    speech = book.try_acquire(GangRequest("s", "speech", "gpu", None, 1, 4, 0), "w", 600)
    assert isinstance(speech, Lease)  # never renewed: expires at start + 2400
    clock.now = start + 3600
    book.release(vision.lease_id)  # 2 GPUs x 1 h
    book.release(vision.lease_id)  # a second release records nothing more
    nlp = book.try_acquire(GangRequest("n", "nlp", "gpu", None, 1, 8, 0), "w", 99_999)
    assert isinstance(nlp, Lease)
    clock.now = start + 5400  # nlp still holds its 8 GPUs: 0.5 h so far

    def hours(since: float) -> dict[tuple[str, str], float]:
        return {(u.team, u.device_class): round(u.hours, 6) for u in book.device_hours(since)}

    assert hours(start) == {
        ("nlp", "gpu"): 8 * 0.5,
        ("speech", "gpu"): round(4 * 600 / 3600, 6),
        ("vision", "gpu"): 2 * 1.0,
    }
    # Only the part of each lease inside the window counts.
    assert hours(start + 3000) == {("nlp", "gpu"): 4.0, ("vision", "gpu"): round(2 * 600 / 3600, 6)}


# -- elastic gangs ---------------------------------------------------------------------------


def elastic(gang_id: str, workers: int, minimum: int, per: int = 8) -> GangRequest:
    return GangRequest(gang_id, "team", "gpu", "H100", workers, per, min_workers=minimum)


def test_an_elastic_gang_starts_with_what_fits_down_to_its_minimum(
    tmp_path: Path, clock: Clock
) -> None:
    book = ledger(tmp_path, cluster(("h", 4, "H100", 8)), clock)
    assert isinstance(book.try_acquire(gang("busy", 1, 8), "op", 60), Lease)  # one node taken
    # A rigid 4-node gang waits; an elastic one (at least 2) starts on the 3 free nodes.
    assert isinstance(book.try_acquire(gang("rigid", 4, 8), "op", 60), Refusal)
    book.forget("rigid")
    lease = book.try_acquire(elastic("flex", 4, 2), "op", 60)
    assert isinstance(lease, Lease) and lease.workers == 3 and lease.min_workers == 2
    assert [p.rank for p in lease.placements] == [0, 1, 2] and len(set(lease.nodes)) == 3
    assert book.lease_for("flex") == lease  # the minimum is kept with the lease
    # When its minimum does not fit, it waits, and the refusal names the minimum.
    refused = book.try_acquire(elastic("late", 4, 2), "op", 60)
    assert isinstance(refused, Refusal) and not refused.never
    assert refused.reason.startswith("2 worker(s) x 8 H100 gpu do not fit now")


def test_an_elastic_gang_takes_its_full_size_when_it_fits(tmp_path: Path, clock: Clock) -> None:
    book = ledger(tmp_path, cluster(("h", 4, "H100", 8)), clock)
    lease = book.try_acquire(elastic("flex", 4, 1), "op", 60)
    assert isinstance(lease, Lease) and lease.workers == 4
    # Larger than the cluster, but its minimum fits: it runs smaller rather than never.
    small = cluster(("h", 2, "H100", 8))
    assert len(place(elastic("big", 6, 2), small, {})) == 2
    never = place(elastic("huge", 6, 3), small, {})
    assert isinstance(never, Refusal) and never.never and "3 worker(s)" in never.reason


def test_min_workers_outside_one_to_workers_is_refused() -> None:
    with pytest.raises(ValueError, match=r"min_workers 5 must be within 1\.\.4"):
        elastic("bad", 4, 5)


def test_a_ledger_written_before_elastic_gangs_is_upgraded(tmp_path: Path, clock: Clock) -> None:
    old = sqlite3.connect(tmp_path / "leases.db")
    old.execute(
        "CREATE TABLE leases (lease_id TEXT PRIMARY KEY, gang_id TEXT NOT NULL UNIQUE, "
        "holder TEXT NOT NULL, team TEXT NOT NULL, device_class TEXT NOT NULL, model TEXT, "
        "placements TEXT NOT NULL, priority INTEGER NOT NULL, preemptible INTEGER NOT NULL, "
        "acquired_at REAL NOT NULL, expires_at REAL NOT NULL)"
    )
    old.execute(
        "INSERT INTO leases VALUES ('l1', 'held', 'op', 'team', 'gpu', 'H100', "
        '\'[{"rank": 0, "node": "h-0", "devices": [0]}]\', 0, 1, 900, 5000)'
    )
    old.commit()
    old.close()
    book = ledger(tmp_path, cluster(("h", 2, "H100", 8)), clock)
    (kept,) = book.leases()
    assert kept.gang_id == "held" and kept.min_workers is None
    assert isinstance(book.try_acquire(elastic("flex", 2, 1), "op", 60), Lease)


def test_a_steps_min_workers_makes_its_request_elastic_only_below_workers() -> None:
    from tideflow.compile.gang_plan import gang_plan_from_json
    from tideflow.gangs import request_from_dict, request_to_dict, resolve_gang

    def request(**config: object) -> GangRequest:
        base = {"device": {"class": "gpu"}, "workers": 4, "devices_per_worker": 8}
        gang = resolve_gang(
            gang_plan_from_json({"entrypoint": ["train"], **base, **config}),
            pipeline="p",
            team="t",
            run_id="r",
            step="s",
            artifact_root="file:///tmp/artifacts",
            allowed_roots=(),
        )
        return gang.request()

    assert request(min_workers=None).min_workers is None
    assert request(min_workers=4).min_workers is None  # equal to workers: rigid
    flexible = request(min_workers="2")  # a rendered template is text
    assert flexible.min_workers == 2 and flexible.elastic
    assert request_from_dict(request_to_dict(flexible)) == flexible  # through the trigger


def _cluster_file(tmp_path: Path, file: str, *nodes: str) -> Path:
    path = tmp_path / file
    lines = [
        f"  - {{name: {n}, cpu: 32, accelerators: {{class: gpu, model: H100, count: 8}}}}"
        for n in nodes
    ]
    path.write_text(
        "apiVersion: tideflow/v1\nkind: Cluster\nmetadata: {name: lab}\nnodes:\n"
        + "\n".join(lines)
        + "\n"
    )
    return path


def test_one_box_named_twice_is_refused_not_booked_twice(tmp_path: Path) -> None:
    """Two cluster files name the same 8-GPU box differently: 8 claims, never 16."""
    from tideflow.gangs import open_ledger
    from tideflow.scheduling import InventoryChangedError

    path = tmp_path / "leases.db"
    first = open_ledger(path, str(_cluster_file(tmp_path, "a.yaml", "box-a")))
    assert isinstance(first.try_acquire(gang("g1", 1, 8), "h", 60), Lease)
    second = open_ledger(path, str(_cluster_file(tmp_path, "b.yaml", "box-b")))
    assert [lease.gang_id for lease in second.leases()] == ["g1"]  # reading needs no check
    with pytest.raises(InventoryChangedError) as refused:
        second.try_acquire(gang("g2", 1, 8), "h", 60)
    message = str(refused.value)
    assert "8 held claim(s) are on devices this process's inventory 'lab' (nodes: box-b)" in message
    assert "box-a gpu 0 (gang g1)" in message and "and 3 more" in message
    assert "TIDEFLOW_CLUSTER_FILE" in message
    assert held(first) == 8


def test_a_process_opened_with_another_inventory_cannot_book_while_leases_are_held(
    tmp_path: Path,
) -> None:
    """Both open while the ledger is idle; the second placement with the other names fails."""
    from tideflow.gangs import open_ledger
    from tideflow.scheduling import InventoryChangedError

    path = tmp_path / "leases.db"
    first = open_ledger(path, str(_cluster_file(tmp_path, "a.yaml", "box-a")))
    second = open_ledger(path, str(_cluster_file(tmp_path, "b.yaml", "box-b")))
    assert isinstance(first.try_acquire(gang("g1", 1, 8), "h", 60), Lease)
    with pytest.raises(InventoryChangedError):
        second.try_acquire(gang("g2", 1, 8), "h", 60)
    assert held(first) == 8
    first.release(first.lease_for("g1").lease_id)  # type: ignore[union-attr]
    # no lease is held any more: the other inventory takes over
    assert isinstance(second.try_acquire(gang("g2", 1, 8), "h", 60), Lease)


def test_an_inventory_that_still_has_every_held_device_takes_over(tmp_path: Path) -> None:
    """A node added while gangs run: their claims are still on known devices."""
    from tideflow.gangs import open_ledger

    path = tmp_path / "leases.db"
    first = open_ledger(path, str(_cluster_file(tmp_path, "a.yaml", "box-a")))
    assert isinstance(first.try_acquire(gang("g1", 1, 8), "h", 60), Lease)
    grown = open_ledger(path, str(_cluster_file(tmp_path, "b.yaml", "box-a", "box-c")))
    lease = grown.try_acquire(gang("g2", 1, 8), "h", 60)
    assert isinstance(lease, Lease) and lease.placements[0].node == "box-c"
    assert isinstance(grown.try_acquire(gang("g3", 1, 8), "h", 60), Refusal)


def test_nodes_held_for_a_reserved_gang_are_where_it_starts_soonest() -> None:
    inventory = cluster(("a", 4, "H100", 8), ("b", 2, "A100", 8))
    used = {"a-0": {0, 1, 2, 3, 4, 5}, "a-1": {0, 1}, "a-2": {0, 1}, "a-3": {0, 1, 2}}
    leases = {"a-0": 1, "a-1": 2, "a-2": 1, "a-3": 1, "b-0": 1, "b-1": 1}
    busy_b = {"b-0": {0, 1, 2, 3}, "b-1": {0, 1, 2, 3}}
    big = gang("big", 2, 8, model=None)
    # Most free first (a-1 and a-2 have 6), then fewest leases to wait for (a-2);
    # one model: the H100 nodes free 12 of 16 where the A100 nodes free 8.
    hold = nodes_to_hold(big, inventory, {**used, **busy_b}, newer={}, leases=leases)
    assert hold == ("a-1", "a-2")
    # A node that took a lease since the reservation began ranks last: the choice
    # stays put while the held nodes drain.
    assert nodes_to_hold(big, inventory, {**used, **busy_b}, newer={"a-2": 2}, leases=leases) == (
        "a-1",
        "a-3",
    )
    # Taken by an earlier reservation: the next best; none left that hold it: ().
    taken = nodes_to_hold(big, inventory, busy_b, newer={}, leases={}, taken=("a-0", "a-1"))
    assert taken == ("a-2", "a-3")
    huge = gang("huge", 3, 8)
    assert nodes_to_hold(huge, inventory, {}, newer={}, leases={}, taken=["a-0", "a-1"]) == ()
    # Kept off them, a gang places as if they were full.
    six = gang("six", 1, 6)
    assert place(six, inventory, used) == (WorkerPlacement(0, "a-1", (2, 3, 4, 5, 6, 7)),)
    fenced = without_nodes(inventory, used, ("a-1", "a-2"), "gpu")
    assert fenced["a-1"] == set(range(8)) and fenced["a-0"] == used["a-0"]
    assert isinstance(place(six, inventory, fenced), Refusal)


def test_a_reservation_does_not_hold_a_node_that_a_lease_ahead_of_it_will_keep(
    tmp_path: Path,
) -> None:
    """The broker's inference reservations (non-preemptible, ahead of every gang, held
    for as long as inference needs them) never drain for a waiting gang: a node they
    claim is no place to hold, however many devices it has free. Held there, the large
    gang would wait as long as inference keeps the node."""
    from tideflow.inventory import load_cluster
    from tideflow.scheduling.quota import Held, Teams
    from tideflow.scheduling.reservation import Claim, reservations

    path = tmp_path / "cluster.yaml"
    path.write_text(
        "apiVersion: tideflow/v1\nkind: Cluster\nmetadata: {name: lab}\nnodes:\n"
        "  - {name: a, count: 3, cpu: 32, accelerators: {class: gpu, model: H100, count: 8}}\n"
        "teams:\n  - {name: risk, quota: [{device: gpu, nominal: 16}]}\n"
        "scheduling: {reserve_after: 30m}\n"
    )
    inventory = load_cluster(path)
    teams = Teams.of(inventory)
    assert teams is not None
    # a-0: one device held by the broker's inference (outside the quotas); a-1, a-2:
    # full of risk's small gangs, which end when they end.
    held = [
        Held("broker/inference/a-0", "inference", "gpu", None, 1, 1_000_000, False, 0.0),
        *(Held(f"risk/small-{i}", "risk", "gpu", None, 4, 0, True, 0.0) for i in range(4)),
    ]
    claims = [Claim("a-0", "l-inference", 0.0, 1_000_000, preemptible=False)] + [
        Claim(f"a-{1 + i // 2}", f"l-small-{i}", 0.0, 0) for i in range(4) for _ in range(4)
    ]
    used = {"a-0": {0}, "a-1": set(range(8)), "a-2": set(range(8))}
    big = GangRequest("risk/big", "risk", "gpu", None, 1, 8)
    (found,) = reservations(
        teams,
        inventory,
        "gpu",
        waiting=[(big, 0.0)],
        held=held,
        used=used,
        claims=claims,
        now=3600.0,
    )
    assert found.nodes in (("a-1",), ("a-2",))
