"""Child process for the crash-consistency test: saves checkpoints until it is killed.

python tests/checkpoint_writer.py STORE_URI SEED
"""

from __future__ import annotations

import random
import sys

from tideflow.checkpoint import CheckpointManager

uri, seed = sys.argv[1], int(sys.argv[2])
rng = random.Random(seed)
manager = CheckpointManager(uri, keep_last=3)
latest = manager.latest(verify=False)
step = 0 if latest is None else latest.step + 1
print("ready", flush=True)
while True:
    shards = {f"rank-{r}.pt": rng.randbytes(rng.randint(1, 1_000_000)) for r in range(3)}
    manager.save(step, shards, metrics={"loss": rng.random()})
    manager.apply_retention(protect=[step])
    step += 1
