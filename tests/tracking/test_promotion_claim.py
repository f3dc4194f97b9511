"""The registration claim: one holder per generation, across processes, on both stores.

The race runs eight processes against each store, fifty rounds, each round a
fresh run that every process tries to claim at the same instant (a barrier
releases them); exactly one may win. The S3 case uses the real SeaweedFS
server's create-only writes (``If-None-Match: *``).
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import Clock
from tideflow.promotion.claim import RegistrationClaim
from tideflow.storage import open_store

PROCESSES = 8
ROUNDS = 50


def _contend(uri: str, worker: int, sync: Any) -> None:
    barrier, out = sync
    store = open_store(uri)
    for round_index in range(ROUNDS):
        claim = RegistrationClaim(store, "model", f"run-{round_index}", ttl_s=600)
        barrier.wait(timeout=60)
        out.put((round_index, worker, claim.try_acquire()))


# The s3 store starts the session's SeaweedFS: those tests are in the servers tier.
@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.servers)])
def store_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "s3":
        request.getfixturevalue("s3_endpoint")
        return f"s3://tideflow/claims-{tmp_path.name}"
    return (tmp_path / "claims").as_uri()


@pytest.mark.processes
def test_exactly_one_process_wins_each_round(store_uri: str) -> None:
    context = multiprocessing.get_context("fork")
    barrier, out = context.Barrier(PROCESSES), context.Queue()
    workers = [
        context.Process(target=_contend, args=(store_uri, worker, (barrier, out)))
        for worker in range(PROCESSES)
    ]
    for process in workers:
        process.start()
    results = [out.get(timeout=120) for _ in range(PROCESSES * ROUNDS)]
    for process in workers:
        process.join(timeout=30)
        assert process.exitcode == 0
    winners = [sum(won for r, _, won in results if r == index) for index in range(ROUNDS)]
    assert winners == [1] * ROUNDS


def test_a_live_claim_holds_an_expired_one_is_taken_over(tmp_path: Path) -> None:
    store, clock = open_store((tmp_path / "c").as_uri()), Clock()
    first = RegistrationClaim(store, "m", "r", ttl_s=60, clock=clock, holder="a")
    second = RegistrationClaim(store, "m", "r", ttl_s=60, clock=clock, holder="b")
    assert first.try_acquire() and first.generation == 1
    clock.now += 59
    assert not second.try_acquire()
    assert second.describe_holder() == "a (generation 1, 59s ago)"
    clock.now += 2  # the first holder stalled past its TTL
    assert second.try_acquire() and second.generation == 2
    assert not first.still_held(), "a holder that was taken over must step aside"
    assert second.still_held()


def test_a_released_claim_is_taken_over_at_once(tmp_path: Path) -> None:
    store, clock = open_store((tmp_path / "c").as_uri()), Clock()
    first = RegistrationClaim(store, "m", "r", ttl_s=600, clock=clock)
    second = RegistrationClaim(store, "m", "r", ttl_s=600, clock=clock)
    assert first.try_acquire()
    first.release()
    assert second.try_acquire() and second.generation == 2


def test_claims_of_different_models_and_runs_are_independent(tmp_path: Path) -> None:
    store = open_store((tmp_path / "c").as_uri())
    names = [("m", "r"), ("m", "r2"), ("m2", "r"), ("it's a/model", "r"), ("it's a_model", "r")]
    assert all(RegistrationClaim(store, m, r).try_acquire() for m, r in names)
    assert not RegistrationClaim(store, "it's a/model", "r").try_acquire()
