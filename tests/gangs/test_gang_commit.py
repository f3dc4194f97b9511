"""The multi-rank commit (runtime.gang_commit) with ranks as threads on a real file store."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from tideflow.checkpoint import CheckpointManager
from tideflow.runtime.gang_commit import GangCommit, receipt_key


def test_a_receipt_left_by_a_stopped_attempt_is_never_committed(tmp_path: Path) -> None:
    """Attempt 1 was killed after rank 1 wrote its shard and receipt for step 5; attempt 2
    reaches step 5 again and rewrites the shard. Rank 0 must wait for rank 1's new
    receipt, not commit the old one (whose checksum no longer matches the shard)."""
    manager = CheckpointManager((tmp_path / "ckpt").as_uri())
    GangCommit(manager, rank=1, world_size=2, attempt="attempt-1").contribute(
        5, {"rank-1.pt": b"written by the killed attempt"}
    )
    results: dict[int, object] = {}

    def rank(number: int, delay: float, data: bytes) -> None:
        time.sleep(delay)
        commit = GangCommit(manager, rank=number, world_size=2, attempt="attempt-2")
        shards = {f"rank-{number}.pt": data}
        if number == 0:
            shards["model.pt"] = b"model"
        results[number] = commit.commit(5, shards, world_size=2)

    threads = [
        threading.Thread(target=rank, args=(0, 0.0, b"rank 0 of attempt 2")),
        threading.Thread(target=rank, args=(1, 0.5, b"rank 1 of attempt 2, longer")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    manifest = results[0]
    assert manifest is not None and results[1] is None
    assert manager.verify(manager.load(5, verify=False)) == []
    assert manager.latest() is not None and manager.latest().step == 5  # type: ignore[union-attr]
    receipt = json.loads(manager.store.get_bytes(receipt_key(5, 1)))
    assert receipt["attempt"] == "attempt-2"


def test_ranks_of_one_attempt_commit_one_checkpoint_with_every_shard(tmp_path: Path) -> None:
    manager = CheckpointManager((tmp_path / "ckpt").as_uri())
    results: dict[int, object] = {}

    def rank(number: int) -> None:
        shards = {f"rank-{number}.pt": f"rank {number}".encode()}
        if number == 0:
            shards["model.pt"] = b"model"
        commit = GangCommit(manager, rank=number, world_size=3, attempt="a")
        results[number] = commit.commit(7, shards, world_size=3)

    threads = [threading.Thread(target=rank, args=(n,)) for n in (2, 1, 0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    manifest = manager.latest()
    assert manifest is not None and manifest.world_size == 3
    assert sorted(r.name for r in manifest.shards) == [
        "model.pt",
        "rank-0.pt",
        "rank-1.pt",
        "rank-2.pt",
    ]
    assert results[1] is None and results[2] is None
