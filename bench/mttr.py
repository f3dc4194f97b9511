"""MTTR of the local backend: SIGKILL of one worker -> first training step after resume.

    .venv/bin/python bench/mttr.py [--trials 3]

Trains the digits MLP with 2 gloo workers through the local gang backend,
kills rank 1 with SIGKILL mid-run, and measures the time from the kill to the
first step the restarted gang completes (workers print a timestamp per step).
Baseline in the same run: the time from submitting a fresh gang to its first
step (process start, torch import, rendezvous), which MTTR cannot beat.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tideflow.backends import GangJob, GangState, WorkerSlot
from tideflow.backends.local import LocalBackend
from tideflow.examples.digits import prepare
from tideflow.steps import StepContext

TARGET_S = 15.0
STEP = re.compile(r"\[rank 0\] step (\d+) loss [0-9.]+ at ([0-9.]+)")


def wait_for(log: Path, pattern: str, timeout_s: float = 120) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        if re.search(pattern, text):
            return text
        time.sleep(0.01)
    raise TimeoutError(f"{pattern!r} not seen in {log}")


def trial(root: Path, splits: dict[str, str], index: int) -> tuple[float, float]:
    backend = LocalBackend(root / "gangs")
    gang = f"mttr-{index}"
    command = (
        sys.executable,
        "-m",
        "tideflow.examples.digits_train",
        "--train",
        splits["train"],
        "--validation",
        splits["validation"],
        "--epochs",
        "50",
        "--checkpoint-every",
        "10",
        "--step-delay",
        "0.02",
    )
    job = GangJob(
        gang,
        command,
        {"TIDEFLOW_CHECKPOINT_URI": (root / gang).as_uri()},
        (WorkerSlot(0, "localhost", (0,)), WorkerSlot(1, "localhost", (1,))),
        "cpu",
        False,
        1,
    )
    submitted = time.time()
    backend.submit(job)
    log = backend.log_path(gang)
    text = wait_for(log, r"\[rank 0\] step 1 loss")
    cold_start = float(STEP.search(text).group(2)) - submitted  # type: ignore[union-attr]
    text = wait_for(log, r"\[rank 0\] step 60 loss")
    pid = int(re.search(r"rank 1: pid (\d+)", text).group(1))  # type: ignore[union-attr]
    killed = time.time()
    os.kill(pid, signal.SIGKILL)
    text = wait_for(log, r"resumed from step \d+ \(restart 1\)[\s\S]*\[rank 0\] step \d+ loss")
    after = text.split("(restart 1)", 1)[1]
    first = float(STEP.search(after).group(2))  # type: ignore[union-attr]
    backend.cancel(gang)
    status = backend.wait(gang, 60)
    assert status.state is GangState.CANCELLED
    return first - killed, cold_start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tideflow-bench-") as scratch:
        root = Path(scratch)
        ctx = StepContext(
            pipeline="digits",
            team="bench",
            step="prep",
            dag_id="digits",
            run_id="bench",
            try_number=1,
            artifact_root=(root / "data").as_uri(),
        )
        splits = prepare(ctx)
        results = [trial(root, splits, index) for index in range(args.trials)]
    mttr = statistics.median(r[0] for r in results)
    cold = statistics.median(r[1] for r in results)
    result = {
        "trials": args.trials,
        "mttr_s": round(mttr, 2),
        "cold_start_s": round(cold, 2),
        "all_mttr_s": [round(r[0], 2) for r in results],
        "target_met": mttr <= TARGET_S,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"median of {args.trials} trials (2 gloo workers, digits MLP)")
        print(f"  SIGKILL -> first step after resume   {mttr:.2f} s  {result['all_mttr_s']}")
        print(f"  baseline: submit -> first step       {cold:.2f} s")
        print(f"  target (<= {TARGET_S:.0f} s): {'met' if result['target_met'] else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
