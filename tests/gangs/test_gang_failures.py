"""Restarts are not burned on a failure that will only repeat (local backend, real gloo
workers), and the failure signature is read from what workers really print."""

from __future__ import annotations

import re
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tideflow.backends import GangJob, GangState, WorkerSlot
from tideflow.backends.failures import (
    FailureSignature,
    first_cause,
    is_deterministic,
    last_exception,
    signature,
)
from tideflow.backends.local import LocalBackend
from tideflow.config import EXIT_HUNG

SCRIPT = Path(__file__).parents[1] / "user_code" / "deterministic_bug.py"


def bug_gang(gang_id: str, tmp_path: Path, *flags: str) -> GangJob:
    return GangJob(
        gang_id=gang_id,
        command=(sys.executable, str(SCRIPT), "--bad-step", "12", *flags),
        env={
            "TIDEFLOW_CHECKPOINT_URI": (tmp_path / "ckpt").as_uri(),
            "TIDEFLOW_CHECKPOINT_EVERY_STEPS": "5",
        },
        slots=tuple(WorkerSlot(rank, "localhost", ()) for rank in range(2)),
        device_class="cpu",
        emulated=False,
        max_restarts=3,
    )


GLOO_PEER = (
    "[rank0]: Traceback (most recent call last):\n"
    '[rank0]:   File "train.py", line 9, in <module>\n'
    "[rank0]:     loss.backward()\n"
    "[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:26517. This is typically caused by a remote worker crashing.\n"
)
OWN_BUG = (
    "step 11 loss 0.2\n"
    "Traceback (most recent call last):\n"
    '  File "train.py", line 30, in main\n'
    '    raise ValueError("bad record")\n'
    "ValueError: bad record\n"
)


def test_the_cause_is_the_rank_whose_own_code_raised(tmp_path: Path) -> None:
    progress = tmp_path / "p.json"
    progress.write_text('{"step": 12, "at": 0}')
    peer = signature(0, 1, GLOO_PEER, progress)
    own = signature(1, 1, OWN_BUG, progress)
    assert peer == FailureSignature(0, 12, "RuntimeError") and peer.peer_lost
    assert own == FailureSignature(1, 12, "ValueError") and not own.peer_lost
    assert first_cause([peer, own]) is own
    assert first_cause([peer]) is peer  # nothing better known
    assert own.said == "ValueError: bad record"  # what a failure message quotes


def test_a_failure_without_a_traceback_quotes_the_ranks_last_line(tmp_path: Path) -> None:
    """A script that cannot start prints no traceback; its last line is the cause."""
    text = "\n/usr/bin/python: can't open file '/w/train.py': [Errno 2] No such file\n\n"
    cannot_start = signature(0, 2, text, tmp_path / "absent.json")
    assert cannot_start == FailureSignature(0, None, "exit code 2")
    assert cannot_start.said == text.strip()
    assert signature(0, 2, "x" * 5000, tmp_path / "absent.json").said == "x" * 300 + "..."
    assert signature(0, -9, text, tmp_path / "absent.json").said == ""  # killed: not its words


def test_only_the_same_rank_step_and_cause_count_as_deterministic(tmp_path: Path) -> None:
    at = FailureSignature(1, 12, "ValueError")
    assert is_deterministic(at, FailureSignature(1, 12, "ValueError"))
    assert not is_deterministic(None, at)
    assert not is_deterministic(at, FailureSignature(1, 13, "ValueError"))
    assert not is_deterministic(at, FailureSignature(0, 12, "ValueError"))
    assert not is_deterministic(at, FailureSignature(1, 12, "KeyError"))
    unknown = FailureSignature(1, None, "signal 9")  # no progress recorded: never
    assert not is_deterministic(unknown, unknown)
    killed = signature(1, -9, OWN_BUG, tmp_path / "absent.json")
    assert killed == FailureSignature(1, None, "signal 9")


def test_a_second_hang_at_the_same_step_is_deterministic(tmp_path: Path) -> None:
    """The watchdog's exit (EXIT_HUNG) is a hang at the step the rank last recorded; hung
    ranks are named by the lowest step (the others wait for it)."""
    progress = tmp_path / "p.json"
    progress.write_text('{"step": 12, "at": 0}')
    first, again = (signature(1, EXIT_HUNG, "", progress) for _ in range(2))
    assert first == FailureSignature(1, 12, "hang") and is_deterministic(first, again)
    assert first.describe() == "hang at step 12 (each rank's stacks are in its log)"
    waiting = FailureSignature(0, 13, "hang")
    assert first_cause([waiting, first]) is first


@given(st.text())
def test_reading_an_exception_from_any_log_never_fails(text: str) -> None:
    found = last_exception(text)
    assert found is None or (found[0] and found[0] in found[1])


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_a_hang_restarts_the_gang_and_a_failure_that_then_repeats_ends_it(
    tmp_path: Path,
) -> None:
    """Rank 1 waits forever at step 12 (hang_timeout 5 s: TIDEFLOW_HANG_TIMEOUT_S, which
    the step's ``hang_timeout`` sets): the hang is noticed, the ranks' stacks are dumped
    and the gang restarts from step 10. Each later attempt raises at step 17: the first
    such failure is new, so it gets a restart; the second repeats it, so the gang ends
    with a restart unused."""
    backend = LocalBackend(tmp_path / "gangs")
    job = bug_gang("story", tmp_path, "--hang", "--then-fail-at", "17")
    job = replace(job, env={**job.env, "TIDEFLOW_HANG_TIMEOUT_S": "5"})
    started = time.monotonic()
    backend.submit(job)
    status = backend.wait("story", 200)
    log = backend.log_path("story").read_text()
    assert status.state is GangState.FAILED and status.restarts == 2, log[-3000:]
    assert "no training progress for" in log and "exiting 77" in log
    # faulthandler's dump of the hung rank: where it waits, in the user's code
    assert re.search(r"\[rank 1\] .*File \".*deterministic_bug\.py\", line \d+ in main", log)
    assert "relaunching; the newest committed checkpoint is step 10" in log  # after the hang
    assert "relaunching; the newest committed checkpoint is step 15" in log  # a new failure
    assert "rank 1: ValueError at step 17 on two attempts in a row" in status.message
    assert "ValueError: bad record in shard 17" in status.message
    assert "not using the 1 restart(s) left" in log
    assert log.count("started 2 worker(s)") == 3
    assert time.monotonic() - started < (5 + 10) + 120  # the hang caught in ~5-10 s


@pytest.mark.parametrize(
    ("declared", "expected"),
    [({}, "1800"), ({"hang_timeout": 120}, "120"), ({"hang_timeout": None}, None)],
)
def test_the_steps_hang_timeout_reaches_every_worker(
    tmp_path: Path, declared: dict[str, Any], expected: str | None
) -> None:
    from tideflow.compile.gang_plan import gang_plan_from_json
    from tideflow.gangs import resolve_gang
    from tideflow.spec.step_kinds import GangTraining

    config = {"entrypoint": ["python", "train.py"], "workers": 2, **declared}
    GangTraining.model_validate(config)  # what the spec accepts
    gang = resolve_gang(
        gang_plan_from_json(config),
        pipeline="p",
        team="t",
        run_id="r",
        step="train",
        artifact_root=tmp_path.as_uri(),
        allowed_roots=[tmp_path.as_uri()],
    )
    assert gang.env.get("TIDEFLOW_HANG_TIMEOUT_S") == expected
    assert gang.cluster_job().env.get("TIDEFLOW_HANG_TIMEOUT_S") == expected
