"""A tiny gang worker for backend tests: no torch, behaviour chosen by env variables.

GANG_TEST_MODE:
  ok            print the rank environment and exit 0
  fail-once     rank 1 exits 3 on the first attempt, every rank succeeds afterwards
  sleep         run until SIGTERM; on SIGTERM exit 75 ("checkpointed, resumable")
  slow          sleep GANG_TEST_SECONDS (default 3), then exit 0

A gang that ends well commits a one-shard checkpoint at step 1 (rank 0) when it
has a store, as a training script does; GANG_TEST_CHECKPOINT=0 leaves it out.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

mode = os.environ.get("GANG_TEST_MODE", "ok")
rank = int(os.environ["RANK"])
restart = int(os.environ["TIDEFLOW_RESTART_COUNT"])
print(
    json.dumps(
        {
            k: os.environ.get(k)
            for k in (
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                "MASTER_ADDR",
                "MASTER_PORT",
                "CUDA_VISIBLE_DEVICES",
                "TIDEFLOW_DEVICE_CLASS",
                "TIDEFLOW_EMULATED",
                "TIDEFLOW_RESTART_COUNT",
            )
        }
    ),
    flush=True,
)

if mode == "fail-once" and rank == 1 and restart == 0:
    sys.exit(3)
if mode == "slow":
    time.sleep(float(os.environ.get("GANG_TEST_SECONDS", "3")))
if mode == "sleep":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))
    print("ready", flush=True)
    while True:
        time.sleep(0.05)

store = os.environ.get("TIDEFLOW_CHECKPOINT_URI")
if store and rank == 0 and os.environ.get("GANG_TEST_CHECKPOINT", "1") == "1":
    from tideflow.checkpoint import CheckpointManager

    CheckpointManager(store).save(1, {"model.pt": b"gang_worker"}, {"loss": 0.0})
