"""What a broker step needs from where it acts (the local ledger, a cluster).

The local actuator (``tideflow.broker.local``) and the cluster's
(``tideflow.broker.kubernetes``) both meet these protocols, and both answer a
decision with an ``Applied``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from tideflow.broker.calibrate import TrainingWork
from tideflow.broker.journal import PreemptionCount
from tideflow.broker.policy import BrokerDecision, GangView


@dataclass(frozen=True)
class Applied:
    """What an actuator did with one decision: what inference holds now and what stopped.

    Both actuators fill ``inference_gpus`` and ``note``; each fills the fields of what
    it moves, and leaves the others empty: the local one stops gangs through the
    ledger, the cluster's evicts pods and moves whole nodes.
    """

    inference_gpus: int  # what inference holds once applied
    note: str
    # The local actuator's: whether the allocation reached the decision's (None: not
    # judged), the gangs asked to checkpoint and stop, those cancelled after the grace
    # (their uncommitted work is lost), and how long it waited for them.
    complete: bool | None = None
    preempted: tuple[str, ...] = ()
    forced: tuple[str, ...] = ()
    waited_s: float | None = None
    # The GPUs of what the step stopped, for the journal (None: not counted here; the
    # local ledger's usage records each stop, ``training_work``).
    stopped_gpus: int | None = None
    # The cluster's: inference's nodes, the pods evicted and those a PDB kept, and
    # inference's replicas evicted off the nodes given back to training (no gang's stop).
    inference_nodes: tuple[str, ...] = ()
    evicted_pods: tuple[str, ...] = ()
    refused_by_pdb: tuple[str, ...] = ()
    moved_replicas: tuple[str, ...] = ()


class Actuator(Protocol):
    """What a broker step needs from where it acts (the local ledger, a cluster)."""

    def total_gpus(self) -> int: ...
    def inference_gpus(self) -> int: ...
    def idle_training_gpus(self) -> int: ...
    def gangs(self) -> tuple[GangView, ...]: ...
    def apply(self, decision: BrokerDecision) -> Applied: ...
    # Inside it, what the step reads is read once: one view of where it acts, for the
    # whole observation (a cluster's nodes and pods listed once, not per question).
    def observing(self) -> AbstractContextManager[None]: ...
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
