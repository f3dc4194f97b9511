"""A training script that handles SIGTERM itself, as users write them.

It starts a data-loader process (which ignores SIGTERM, as loaders that mask
signals do), then trains until it is killed. What it does on SIGTERM is chosen by
``STUBBORN_ON_TERM``:

  keep-training  print that it will finish the epoch first, and keep training
  exit           exit 0 at once, forgetting its data loader (which keeps running)

Both processes' pids go to ``$STUBBORN_DIR/pids-RANK`` ("worker loader"), and the
time of each step to ``$STUBBORN_DIR/step-RANK``, so a test can tell whether any of
them still runs, and when the last step was taken.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

LOADER = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "while True:\n"
    "    time.sleep(0.1)\n"
)

rank = int(os.environ["RANK"])
out = Path(os.environ["STUBBORN_DIR"])
on_term = os.environ.get("STUBBORN_ON_TERM", "keep-training")


def handle_term(signum: int, frame: object) -> None:
    if on_term == "exit":
        sys.exit(0)
    print(f"rank {rank}: SIGTERM received; finishing the epoch first", flush=True)


def write(name: str, text: str) -> None:
    tmp = out / f".{name}.tmp"
    tmp.write_text(text)
    os.replace(tmp, out / name)


signal.signal(signal.SIGTERM, handle_term)
loader = subprocess.Popen([sys.executable, "-c", LOADER])
write(f"pids-{rank}", f"{os.getpid()} {loader.pid}")
step = 0
while True:
    step += 1
    write(f"step-{rank}", f"{step} {time.time()}")
    if step % 10 == 0:
        print(f"rank {rank}: step {step}", flush=True)
    time.sleep(0.1)
