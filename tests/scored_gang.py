"""A gang worker that commits one checkpoint per score, as a training run that peaked early.

python tests/scored_gang.py --scores 0.93,0.951,0.944 [--metric val_accuracy]

Rank 0 commits steps 10, 20, 30, ... to the gang's store ($TIDEFLOW_CHECKPOINT_URI),
each with its score as the metric, as ``tideflow.checkpoints().save(step, metrics=...)``
records it.
"""

from __future__ import annotations

import argparse
import os

from tideflow.checkpoint import CheckpointManager

parser = argparse.ArgumentParser()
parser.add_argument("--scores", required=True)
parser.add_argument("--metric", default="val_accuracy")
args = parser.parse_args()
if os.environ["RANK"] == "0":
    manager = CheckpointManager(os.environ["TIDEFLOW_CHECKPOINT_URI"])
    for index, score in enumerate(float(s) for s in args.scores.split(",")):
        step = 10 * (index + 1)
        manager.save(step, {"model.pt": f"weights at {step}".encode()}, {args.metric: score})
    print(f"committed {index + 1} checkpoints", flush=True)
