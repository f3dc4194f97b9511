"""A create-only claim that lets exactly one promotion attempt register a version.

MLflow's registry has no "register if absent": two attempts of one promotion
that start together (Airflow retries, a cleared task racing a slow one, two
triggerers) both see no version for their run and both register one. The
registry cannot break the tie, so the artifact store does: an attempt must
first create the claim object ``promotion-claims/<model>/<run>/gen-N.json``
with a create-only write (``If-None-Match: *`` on S3, ``link()`` on a file
store). Exactly one attempt creates a given generation; it builds the model,
registers the version and moves the alias. The others wait for the version
it registers.

A holder that dies leaves its generation behind. After ``ttl_s`` without the
version appearing, a waiter creates the next generation and takes over; a
holder checks it still holds the newest generation before registering, so a
holder that merely stalled past the TTL steps aside instead of registering a
second version. This holds across processes and hosts as long as they share
the artifact store and their clocks agree to within a small part of the TTL.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tideflow import settings_registry as registry
from tideflow.storage import Store, unique_segment

_GENERATION = re.compile(r"gen-(\d{6})\.json$")


def claim_ttl_s() -> float:
    """How long a claim stands without its version before another attempt takes over."""
    return registry.number("TIDEFLOW_PROMOTION_CLAIM_TTL_S")


@dataclass
class RegistrationClaim:
    store: Store
    model: str
    run_id: str
    ttl_s: float = field(default_factory=claim_ttl_s)
    clock: Callable[[], float] = time.time
    holder: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    generation: int | None = None  # the generation this attempt holds, once it holds one
    token: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def prefix(self) -> str:
        return (
            f"promotion-claims/{unique_segment(self.model, 12)}/{unique_segment(self.run_id, 12)}"
        )

    def _key(self, generation: int) -> str:
        return f"{self.prefix}/gen-{generation:06d}.json"

    def _released_key(self, generation: int) -> str:
        return f"{self.prefix}/gen-{generation:06d}.released.json"

    def generations(self) -> list[int]:
        found = (_GENERATION.search(key) for key in self.store.list(self.prefix))
        return sorted(int(match.group(1)) for match in found if match)

    def _read(self, generation: int) -> dict[str, Any]:
        # Claims are created whole (create-only) and never deleted: a listed one can be read.
        try:
            document = json.loads(self.store.get_bytes(self._key(generation)))
        except ValueError:  # not JSON: not a claim anyone can hold; it expires at once
            return {}
        return dict(document) if isinstance(document, dict) else {}

    def try_acquire(self) -> bool:
        """Create the first generation, or the next one if the newest has expired."""
        taken = self.generations()
        if taken:
            newest = taken[-1]
            claimed_at = float(self._read(newest).get("claimed_at", 0.0))
            released = self.store.exists(self._released_key(newest))
            if not released and self.clock() < claimed_at + self.ttl_s:
                return False
            candidate = newest + 1
        else:
            candidate = 1
        document = {
            "model": self.model,
            "run_id": self.run_id,
            "holder": self.holder,
            "token": self.token,
            "claimed_at": self.clock(),
            "ttl_s": self.ttl_s,
        }
        data = json.dumps(document, sort_keys=True).encode()
        if self.store.put_bytes_if_absent(self._key(candidate), data):
            self.generation = candidate
            return True
        return False

    def release(self) -> None:
        """Let a waiting attempt take over now (this attempt failed) instead of after the TTL."""
        if self.generation is not None:
            marker = json.dumps({"holder": self.holder, "released_at": self.clock()}).encode()
            self.store.put_bytes(self._released_key(self.generation), marker)
            self.generation = None

    def still_held(self) -> bool:
        """Whether no later generation has been created since this attempt's."""
        if self.generation is None:
            return False
        taken = self.generations()
        newest = self._read(self.generation)
        return bool(taken) and taken[-1] == self.generation and newest.get("token") == self.token

    def describe_holder(self) -> str:
        taken = self.generations()
        if not taken:
            return "nobody"
        document = self._read(taken[-1])
        age = self.clock() - float(document.get("claimed_at", 0.0))
        return f"{document.get('holder', '?')} (generation {taken[-1]}, {age:.0f}s ago)"
