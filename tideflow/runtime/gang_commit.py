"""One checkpoint from the files of many ranks, committed without a collective.

Every rank writes its own shards into the store, then a receipt listing them
(``step-N/receipt-rank-R.json``); rank 0 commits the manifest once it holds a
receipt from every rank. The commit never waits for the training loop (no
collective runs on the writing thread), and a checkpoint that lacks a rank's
shards is never committed. Receipts are not shards: they are not in the
manifest, and retention deletes them with their step.

A receipt names the attempt that wrote it (``TIDEFLOW_ATTEMPT_ID``, new for
every launch of the gang): a receipt a killed attempt left for the same step
names shards that this attempt is rewriting, and rank 0 never commits it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tideflow import settings_registry as registry
from tideflow.checkpoint import CheckpointManager, Manifest, ShardRecord
from tideflow.checkpoint.manifest import step_prefix

RECEIPT_TIMEOUT_S = 600.0
ATTEMPT_ENV = registry.declared("TIDEFLOW_ATTEMPT_ID").name
_POLL_S = 0.05


def receipt_key(step: int, rank: int) -> str:
    return f"{step_prefix(step)}/receipt-rank-{rank}.json"


class GangCommit:
    """The commit protocol of one rank of a gang of ``world_size`` ranks."""

    def __init__(
        self,
        manager: CheckpointManager,
        *,
        rank: int,
        world_size: int,
        receipt_timeout_s: float = RECEIPT_TIMEOUT_S,
        attempt: str | None = None,
    ) -> None:
        self.manager = manager
        self.rank = rank
        self.world_size = world_size
        self.receipt_timeout_s = receipt_timeout_s
        self.attempt = attempt if attempt is not None else registry.text(ATTEMPT_ENV)

    def contribute(self, step: int, shards: Mapping[str, bytes | Path]) -> list[ShardRecord]:
        """Write this rank's shards of ``step``, then its receipt naming them."""
        records = [self.manager.write_shard(step, name, data) for name, data in shards.items()]
        receipt = {
            "attempt": self.attempt,
            "shards": [
                {"name": r.name, "key": r.key, "sha256": r.sha256, "size": r.size} for r in records
            ],
        }
        self.manager.store.put_bytes(receipt_key(step, self.rank), json.dumps(receipt).encode())
        return records

    def collect(self, step: int) -> list[ShardRecord]:
        """Every rank's shards of ``step`` (rank 0), waiting for the ranks still writing."""
        deadline = time.monotonic() + self.receipt_timeout_s
        found: dict[int, list[ShardRecord]] = {}
        while len(found) < self.world_size:
            for rank in range(self.world_size):
                if rank not in found:
                    records = self._receipt(step, rank)
                    if records is not None:
                        found[rank] = records
            if len(found) < self.world_size:
                if time.monotonic() > deadline:
                    missing = sorted(set(range(self.world_size)) - set(found))
                    raise TimeoutError(
                        f"checkpoint step {step}: ranks {missing} never wrote their shards"
                    )
                time.sleep(_POLL_S)
        return [record for rank in sorted(found) for record in found[rank]]

    def _receipt(self, step: int, rank: int) -> list[ShardRecord] | None:
        try:
            data = json.loads(self.manager.store.get_bytes(receipt_key(step, rank)))
        except Exception:  # not written yet
            return None
        if not isinstance(data, dict) or data.get("attempt", "") != self.attempt:
            return None  # left by an attempt that was stopped (or an older tideflow)
        return [
            ShardRecord(d["name"], d["key"], d["sha256"], int(d["size"])) for d in data["shards"]
        ]

    def commit(
        self,
        step: int,
        shards: Mapping[str, bytes | Path],
        *,
        metrics: Mapping[str, float] | None = None,
        meta: Mapping[str, Any] | None = None,
        world_size: int | None = None,
    ) -> Manifest | None:
        """Contribute this rank's ``shards``; rank 0 also commits the whole checkpoint.

        ``world_size`` is recorded in the manifest when the shards follow the gang
        layout (``model.pt`` and ``rank-R.pt``); other layouts leave it None and
        keep the number of ranks in ``meta``.
        """
        self.contribute(step, shards)
        if self.rank != 0:
            return None
        records: Sequence[ShardRecord] = self.collect(step)
        return self.manager.commit(
            step,
            records,
            metrics,
            {**(meta or {}), "world_size": self.world_size},
            world_size=world_size,
        )
