"""The resource broker: shifts GPUs between inference and training by time-of-day load.

Load sources (trace, synthetic, Prometheus) -> a forecast from history only ->
a pure policy (snapshot -> decision) -> actuators. The simulator replays a
user's trace against a training backlog to compare the broker with a static
and a cron split before turning it on.
"""

from tideflow.broker.forecast import Forecast, LoadForecaster, clean_outages
from tideflow.broker.jobs import JobSpec, load_jobs, synthetic_jobs
from tideflow.broker.load import (
    LoadSample,
    LoadSource,
    LoadSourceError,
    PrometheusLoad,
    SyntheticLoad,
    TraceLoad,
)
from tideflow.broker.policy import (
    Action,
    BrokerDecision,
    GangView,
    PolicyConfig,
    Reclaim,
    Snapshot,
    decide,
    gpus_for,
)
from tideflow.broker.simulate import simulate
from tideflow.broker.simulation import SimulationConfig, SimulationResult

__all__ = [
    "Action",
    "BrokerDecision",
    "Forecast",
    "GangView",
    "JobSpec",
    "LoadForecaster",
    "LoadSample",
    "LoadSource",
    "LoadSourceError",
    "PolicyConfig",
    "PrometheusLoad",
    "Reclaim",
    "SimulationConfig",
    "SimulationResult",
    "Snapshot",
    "SyntheticLoad",
    "TraceLoad",
    "clean_outages",
    "decide",
    "gpus_for",
    "load_jobs",
    "simulate",
    "synthetic_jobs",
]
