"""What a broker step needs from where it acts (the local ledger, a cluster).

The local actuator (``tideflow.broker.local``) and the cluster's
(``tideflow.broker.kubernetes``) both meet these protocols.
"""

from __future__ import annotations

from typing import Any, Protocol

from tideflow.broker.calibrate import TrainingWork
from tideflow.broker.journal import PreemptionCount
from tideflow.broker.policy import BrokerDecision, GangView


class Actuator(Protocol):
    """What a broker step needs from where it acts (the local ledger, a cluster)."""

    def total_gpus(self) -> int: ...
    def inference_gpus(self) -> int: ...
    def idle_training_gpus(self) -> int: ...
    def gangs(self) -> tuple[GangView, ...]: ...
    def apply(self, decision: BrokerDecision) -> Any: ...
    # Training nodes no gang holds (None: the actuator does not place by node), and
    # those holding a lease the broker may not stop.
    def empty_nodes(self) -> int | None: ...
    def pinned_nodes(self) -> frozenset[str]: ...
    # Training's time and stops over a past span (None: no record of them here).
    def training_work(self, since_s: float, until_s: float) -> TrainingWork | None: ...
    # How often the cluster's own queue has preempted each training workload, for the
    # journal to count where the actuator keeps no record of training's work.
    # (None: the actuator does not watch them; the journal then records nothing.)
    def preemption_counts(self) -> tuple[PreemptionCount, ...] | None: ...


class TenantActuator(Actuator, Protocol):
    """An actuator that may act as inference's tenant of the cluster file's teams."""

    @property
    def tenant(self) -> bool: ...
    def capacity(self) -> int: ...
    def least_gpus(self) -> int: ...
