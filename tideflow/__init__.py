"""tideflow: declarative ML training pipelines on shared GPU clusters.

A training script needs only this package's two names (they import torch, so
they load on first use, not with the package):

``tideflow.checkpoints(model=..., optimizer=..., sampler=...)``
    crash-consistent checkpoints, exact resume, checkpoint-before-evict and the
    health guard (``tideflow.runtime.checkpoints``);
``tideflow.ResumableSampler``
    ``DistributedSampler`` that resumes mid-epoch (``tideflow.runtime.sampler``).

An evaluation entry point or a promotion builder reads its checkpoint with
``tideflow.TrainedCheckpoint.from_arguments(kwargs).state()``
(``tideflow.steps.contracts``).
"""

from typing import Any

from tideflow.version import __version__ as __version__

__all__ = ["Checkpoints", "ResumableSampler", "TrainedCheckpoint", "checkpoints"]


def __getattr__(name: str) -> Any:
    if name in ("checkpoints", "Checkpoints"):
        import importlib

        # the module, not tideflow.runtime's re-export of the function of that name
        return getattr(importlib.import_module("tideflow.runtime.checkpoints"), name)
    if name == "ResumableSampler":
        from tideflow.runtime.sampler import ResumableSampler

        return ResumableSampler
    if name == "TrainedCheckpoint":
        from tideflow.steps.contracts import TrainedCheckpoint

        return TrainedCheckpoint
    raise AttributeError(f"module 'tideflow' has no attribute {name!r}")
