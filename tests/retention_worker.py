"""A one-worker gang for the store-confinement test: saves steps 1..3 with retention.

Writes where the platform tells it to (``$TIDEFLOW_CHECKPOINT_URI``) and keeps
``$TIDEFLOW_KEEP_LAST`` checkpoints, as the training runtime does.
"""

from __future__ import annotations

import os

from tideflow.checkpoint import CheckpointManager

manager = CheckpointManager(
    os.environ["TIDEFLOW_CHECKPOINT_URI"], keep_last=int(os.environ["TIDEFLOW_KEEP_LAST"])
)
for step in (1, 2, 3):
    manager.save(step, {"model.pt": b"weights", "rank-0.pt": b"state"}, world_size=1)
    manager.apply_retention(protect=[step])
print("saved", [m.step for m in manager.committed()], flush=True)
