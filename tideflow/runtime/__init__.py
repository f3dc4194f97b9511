"""The library a training entry point calls inside each gang worker.

torch is imported here (workers need it); mlflow only when metrics are sent.
"""

from tideflow.runtime.amp import MixedPrecision
from tideflow.runtime.checkpointing import AsyncCheckpointer
from tideflow.runtime.checkpoints import Checkpoints, checkpoints
from tideflow.runtime.config import EnvConfig
from tideflow.runtime.distributed import DistInfo, all_agree, cleanup, init_distributed
from tideflow.runtime.health import (
    HealthGuard,
    TrainingDiverged,
    TrainingStalled,
    TrainingUnhealthy,
)
from tideflow.runtime.metrics import MetricsLogger
from tideflow.runtime.preemption import EXIT_PREEMPTED, EXIT_UNHEALTHY, PreemptionWatcher
from tideflow.runtime.sampler import ResumableDistributedSampler, ResumableSampler
from tideflow.runtime.seeding import rng_state, seed_everything, set_rng_state
from tideflow.tracking.spool import flush_spool

__all__ = [
    "EXIT_PREEMPTED",
    "EXIT_UNHEALTHY",
    "AsyncCheckpointer",
    "Checkpoints",
    "DistInfo",
    "EnvConfig",
    "HealthGuard",
    "MetricsLogger",
    "MixedPrecision",
    "PreemptionWatcher",
    "ResumableDistributedSampler",
    "ResumableSampler",
    "TrainingDiverged",
    "TrainingStalled",
    "TrainingUnhealthy",
    "all_agree",
    "checkpoints",
    "cleanup",
    "flush_spool",
    "init_distributed",
    "rng_state",
    "seed_everything",
    "set_rng_state",
]
