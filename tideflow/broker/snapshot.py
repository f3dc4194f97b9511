"""What the broker's policy sees: the cluster's inference and training at one moment.

The policy (``tideflow.broker.policy``) and its choice of victims
(``tideflow.broker.reclaims``) are pure functions of a ``Snapshot``; each actuator
builds one from what it reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from tideflow.broker.forecast import Forecast


@dataclass(frozen=True)
class GangView:
    """A training gang on the shared pool, as the policy sees it."""

    gang_id: str
    gpus: int
    priority: int = 0
    last_checkpoint_s: float = 0.0  # when its newest checkpoint was committed (or it started)
    min_gpus: int | None = None  # elastic lower bound; None = rigid
    nodes: tuple[str, ...] = ()  # the nodes it runs on, where the actuator knows them
    team: str | None = None  # a declared team, where the actuator reads teams (a cluster's)
    started_s: float = 0.0  # when its first worker started, where the actuator knows it


@dataclass(frozen=True)
class Snapshot:
    now_s: float
    inference_gpus: int  # allocated to inference now
    measured_rps: float | None  # the last complete window; None = data gap
    forecast: Forecast
    idle_training_gpus: int  # training-pool GPUs no gang holds
    gangs: tuple[GangView, ...] = ()
    last_lend_s: float | None = None  # when inference last lent GPUs to training
    lend_forecast: Forecast | None = None  # over config.lend_horizon_s; None: use forecast
    # Training nodes no gang holds, where the actuator places gangs on nodes it names
    # (None: it does not; the policy counts GPUs).
    empty_nodes: int | None = None
    # Training nodes that also hold what the policy may not stop (a gang that is not
    # preemptible): stopping the gangs it sees there empties no node.
    pinned_nodes: frozenset[str] = frozenset()

    @property
    def placed(self) -> bool:
        """Whether growth must free whole nodes: the actuator names every gang's nodes."""
        return self.empty_nodes is not None and all(g.nodes for g in self.gangs)
