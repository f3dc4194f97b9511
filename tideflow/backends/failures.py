"""How a gang attempt failed, to tell a deterministic failure from a flaky one.

A restart helps when a worker died of something outside the code (a node, a
flaky network, a kill). When a restart fails again on the same rank, at the
same training step, with the same exception type, it will fail the same way
on every attempt, and the restarts left would only be burned. The supervisor
compares each failed attempt's signature with the one before and fails the
gang at once when they match. Preemptions never get here: they are not
failures.

The step is what the worker's runtime last recorded in its progress file
(``tideflow.checkpoints().save`` writes it); the exception type is read from
the last traceback in the rank's log of that attempt.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from tideflow.config import EXIT_HUNG

# The line that ends a Python traceback: "ValueError: ...", "pkg.mod.Error: ..." or a bare name.
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(:|$)")
# torch.distributed prefixes a worker's uncaught traceback with its rank.
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?")
SAID_MAX = 300  # characters of a rank's line a failure message quotes
# What a rank raises when a peer died first: a consequence, not the cause.
PEER_LOST = (
    "Connection closed by peer",
    "Connection reset by peer",
    "remote worker crashing",
    "DistBackendError",
    "DistNetworkError",
    "NCCL communicator was aborted",
)


@dataclass(frozen=True)
class FailureSignature:
    rank: int
    step: int | None  # the last step its runtime recorded; None if it records none
    cause: str  # the exception type, or "signal N" / "exit code N"
    peer_lost: bool = field(default=False, compare=False)  # it died because a peer did
    # What a failure message quotes: the exception's line, else the rank's last line (a
    # script that cannot start prints no traceback); "" for a signal, not the rank's words.
    said: str = field(default="", compare=False)

    def printed(self) -> str:
        """The rank's own words, for the end of a failure message ("" when none)."""
        return f"; rank {self.rank} printed: {self.said}" if self.said else ""

    def describe(self) -> str:
        at = f" at step {self.step}" if self.step is not None else ""
        if self.cause == "hang":  # every rank stops; which one waits for whom, the stacks say
            return f"hang{at} (each rank's stacks are in its log)"
        return f"rank {self.rank}: {self.cause}{at}"


def last_exception(log_text: str) -> tuple[str, str] | None:
    """(type, its line) of the last traceback's exception in ``log_text``, if any."""
    start = log_text.rfind("Traceback (most recent call last):")
    if start < 0:
        return None
    for raw in log_text[start:].splitlines()[1:]:
        line = _RANK_PREFIX.sub("", raw)
        if not line or line[0].isspace():
            continue
        match = _EXCEPTION_LINE.match(line)
        if match:
            return match.group(1), line
    return None


def _last_line(log_text: str) -> str:
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    last = _RANK_PREFIX.sub("", lines[-1]) if lines else ""
    return last if len(last) <= SAID_MAX else last[:SAID_MAX] + "..."


def progress_step(path: Path) -> int | None:
    try:
        return int(json.loads(path.read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def signature(rank: int, code: int, log_text: str, progress: Path) -> FailureSignature:
    """The signature of rank ``rank`` dying with ``code`` (negative: a signal)."""
    step = progress_step(progress)
    if code == EXIT_HUNG:  # the runtime's watchdog: no progress for hang_timeout
        return FailureSignature(rank, step, "hang")
    if code < 0:
        return FailureSignature(rank, step, f"signal {-code}")
    found = last_exception(log_text)
    if found is None:
        return FailureSignature(rank, step, f"exit code {code}", said=_last_line(log_text))
    kind, line = found
    lost = any(marker in line for marker in PEER_LOST)
    return FailureSignature(rank, step, kind, peer_lost=lost, said=_last_line(line))


def first_cause(signatures: list[FailureSignature]) -> FailureSignature:
    """The failure that caused the others: the first rank not dying of a lost peer; of
    hung ranks, the one that reached the lowest step (the others wait for it)."""
    hung = [s for s in signatures if s.cause == "hang"]
    if hung and len(hung) == len(signatures):
        return min(hung, key=lambda s: (s.step is None, s.step or 0, s.rank))
    return next((s for s in signatures if not s.peer_lost), signatures[0])


def is_deterministic(previous: FailureSignature | None, current: FailureSignature) -> bool:
    """The same failure twice in a row: same rank, same step, same cause.

    A step is required: without one, two failures of the same kind may still be
    far apart in training (a flaky read, an out-of-memory now and then).
    """
    return previous is not None and current.step is not None and previous == current
