"""The Kubernetes actuator: the broker's decision applied to a cluster's objects.

* Nodes move between the ``inference`` and ``training`` pools as a whole
  (``tideflow.broker.kube_pools``); they are chosen so that the training pool keeps
  whole nodes.
* The inference Deployment is scaled to what its pool holds, or its HPA's bounds
  are moved (``tideflow.broker.kube_inference``).
* The training quota follows: a Volcano Queue's ``capability`` or a Kueue
  ClusterQueue flavor's ``nominalQuota`` (``tideflow.broker.kube_queue``).
* Reclaimed gangs are evicted through the Eviction API, so PodDisruptionBudgets
  hold (``tideflow.broker.kube_evictions``).
* As the tenant ``inference`` of its cluster file, the broker keeps to that team's
  quota and rules (``tideflow.broker.kube_tenant``).

It speaks to the API server through the official ``kubernetes`` client; the
Role it needs is in ``deploy/kubernetes/broker-rbac.yaml``. Every name the
actuator's parts define is importable from here.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from tideflow.broker.actuator import Applied
from tideflow.broker.journal import PreemptionCount
from tideflow.broker.kube_evictions import Evictor, PodEvictions
from tideflow.broker.kube_inference import InferenceService
from tideflow.broker.kube_kueue_counts import kueue_preemption_counts
from tideflow.broker.kube_pools import NodePools
from tideflow.broker.kube_queue import TrainingQueue, TrainingQueueRefusedError
from tideflow.broker.kube_target import (
    DEVICE_CLASSES,
    KUEUE_PREEMPTED,
    POOL,
    QUEUE_KINDS,
    TAINT_KEY,
    ClusterTarget,
    few,
    target_from_env,
)
from tideflow.broker.kube_tenant import InferenceTenant, pool_model
from tideflow.broker.policy import BrokerDecision, GangView
from tideflow.broker.tenant import ceiling, floor, governs_inference
from tideflow.broker.volcano_stops import VolcanoStops
from tideflow.compile.cluster_names import POOL_LABEL
from tideflow.inventory import load_cluster
from tideflow.kube.client import MERGE
from tideflow.scheduling.quota import Teams
from tideflow.steps.context import GANG_LABEL

__all__ = [
    "DEVICE_CLASSES",
    "KUEUE_PREEMPTED",
    "MERGE",
    "POOL",
    "POOL_LABEL",
    "QUEUE_KINDS",
    "TAINT_KEY",
    "ClusterTarget",
    "KubernetesActuator",
    "PodEvictions",
    "TrainingQueueRefusedError",
    "target_from_env",
]

log = logging.getLogger(__name__)


class KubernetesActuator:
    def __init__(
        self,
        api_client: Any,
        target: ClusterTarget,
        *,
        grace_s: float = 300.0,
        retry_s: float = 5.0,
        node_gpus: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api_client)
        self.target = target
        self.grace_s = grace_s
        self.node_gpus = node_gpus  # GPUs per node the policy moves (None: not known)
        self.clock = clock
        self.device_class = DEVICE_CLASSES.get(target.gpu_resource, "gpu")
        self.pools = NodePools(client.CoreV1Api(api_client), target)
        # Volcano's gangs carry their stops on their Jobs (tideflow.kube.volcano_lineage)
        self.volcano = (
            VolcanoStops(self.custom, target.namespace, self.pools.spec_gpus)
            if target.queue_kind == "volcano"
            else None
        )
        self.evictor = Evictor(self.pools, self.volcano, retry_s=retry_s, clock=clock, sleep=sleep)
        self.inference = InferenceService(
            client.AppsV1Api(api_client), client.AutoscalingV2Api(api_client), target
        )
        self.queue = TrainingQueue(self.custom, target)
        self.rules: InferenceTenant | None = None  # set when the broker is inference's tenant
        if target.cluster_file:
            inventory = load_cluster(target.cluster_file)
            teams = Teams.of(inventory)
            if teams is not None and governs_inference(teams) and inventory.teams is not None:
                model = pool_model(inventory.teams, self.device_class)
                self.rules = InferenceTenant(
                    teams, model, self.device_class, self.pools, self.evictor
                )

    @property
    def teams(self) -> Teams | None:
        """The cluster file's teams when the broker is inference's tenant."""
        return None if self.rules is None else self.rules.teams

    @property
    def model(self) -> str | None:
        """The pool's device model in the cluster file (tenant only)."""
        return None if self.rules is None else self.rules.model

    @property
    def tenant(self) -> bool:
        """Whether inference is a team of the broker's cluster file."""
        return self.rules is not None

    def capacity(self) -> int:
        """The most GPUs inference may hold: its team's nominal quota when it is a
        tenant, else every GPU node the broker manages."""
        total = self.total_gpus()
        return total if self.rules is None else ceiling(self.rules.teams, self.rules.key(), total)

    def least_gpus(self) -> int:
        """The fewest GPUs inference keeps whatever the decision: as a tenant, the part
        of its quota that its rules let nobody borrow (the compiled queues would lend
        anything more to any team)."""
        if self.rules is None:
            return 0
        return floor(self.rules.teams, self.rules.key(), self.total_gpus())

    # -- reading ------------------------------------------------------------------------
    def gpu_nodes(self) -> list[Any]:
        return self.pools.gpu_nodes()

    def total_gpus(self) -> int:
        return sum(self.pools.gpus(n) for n in self.gpu_nodes())

    def node_sizes(self) -> dict[str, int]:
        """Each selected node's allocatable GPUs, nodes with none left out."""
        gpus = self.pools.gpus
        return {n.metadata.name: gpus(n) for n in self.gpu_nodes() if gpus(n)}

    def inference_gpus(self) -> int:
        nodes = self.gpu_nodes()
        return sum(self.pools.gpus(n) for n in nodes if self.pools.pool(n) == "inference")

    def idle_training_gpus(self) -> int:
        nodes = self.gpu_nodes()
        free = sum(self.pools.gpus(n) for n in nodes if self.pools.pool(n) != "inference")
        return free - sum(self.pools.pod_gpus(p) for p in self.pools.training_pods())

    def empty_nodes(self) -> int | None:
        """Training nodes no live pod runs on; None (the policy counts GPUs) unless every
        GPU node holds the ``node_gpus`` the policy moves."""
        nodes = self.gpu_nodes()
        if self.node_gpus is None or any(self.pools.gpus(n) != self.node_gpus for n in nodes):
            return None
        busy = self.pools.busy_nodes()
        return sum(
            1 for n in nodes if self.pools.pool(n) != "inference" and n.metadata.name not in busy
        )

    def pinned_nodes(self) -> frozenset[str]:
        """Training nodes running a pod of no tideflow gang, which the broker never evicts."""
        return frozenset(
            p.spec.node_name
            for p in self.pools.training_pods()
            if not (p.metadata.labels or {}).get(GANG_LABEL)
        )

    def training_work(self, since_s: float, until_s: float) -> None:
        """None: the cluster keeps no record of the work its preemptions cost (Kueue and
        Volcano journal no usage), so the broker weighs its own journal's (the training
        GPUs it saw at each step, the pods it evicted and the preemptions Kueue counted;
        ``DecisionJournal.training_work``)."""
        return None

    def preemption_counts(self) -> tuple[PreemptionCount, ...] | None:
        """How often the cluster's gang scheduler has stopped each training gang, for
        any cause but the broker (between teams, by priority within one, a drain), as
        the local ledger counts every stop. Kueue: each gang Workload's count
        (``tideflow.broker.kube_kueue_counts``). Volcano keeps no count; tideflow's Jobs
        carry one from each gang's Job to the next (``tideflow.broker.volcano_stops``).
        None where nothing can be read (a Role from before these were listed): logged
        and skipped rather than failing the step that already acted."""
        if self.volcano is not None:
            return self.volcano.counts()
        return kueue_preemption_counts(self.custom, self.target, self.pools.spec_gpus)

    def gangs(self) -> tuple[GangView, ...]:
        """Gangs on the training pool (``NodePools.gangs``)."""
        return self.pools.gangs(self.pools.training_pods())

    def observing(self) -> AbstractContextManager[None]:
        """The nodes and the training pool's pods listed once (``NodePools.reading``)."""
        return self.pools.reading()

    # -- acting -------------------------------------------------------------------------
    def _set_pool(self, node: Any, pool: str) -> None:
        """Move ``node`` into ``pool`` (its label and taint; ``NodePools.set_pool``)."""
        self.pools.set_pool(node, pool)

    def _set_training_quota(self, gpus: int) -> int:
        """Move the training queue's GPU quota to ``gpus``; the quota written."""
        return self.queue.set_quota(gpus)

    def _grow(
        self,
        decision: BrokerDecision,
        training: list[Any],
        inference: list[Any],
        *,
        have: int,
        wanted: int,
        started: float,
    ) -> tuple[int, PodEvictions, str]:
        """Evict the decision's reclaimed gangs, then take whole empty nodes (the ones
        the evictions emptied; by name for a stable order): a node still running a pod
        would put inference's replicas beside its workers. What is still busy is a
        shortfall."""
        done = PodEvictions()
        deadline = started + self.grace_s
        for reclaim in decision.reclaims:
            if reclaim.evicted:
                done.add(self.evictor.evict_gang(reclaim.gang_id, deadline))
        busy = self.pools.busy_nodes()
        for node in training:
            if have >= wanted:
                break
            if node.metadata.name in busy:
                continue
            self.pools.set_pool(node, "inference")
            inference.append(node)
            have += self.pools.gpus(node)
        note = ""
        if have < wanted:
            note = (
                f"; {wanted - have} GPUs short: the other training nodes still run pods "
                "or are cordoned or not Ready"
                + (" (a PDB kept the evictions)" if done.refused else "")
            )
        return have, done, note

    def _shrink(self, inference: list[Any], *, have: int, wanted: int) -> int:
        """Give inference's nodes back to training, highest name first, down to ``wanted``."""
        for node in sorted(inference, key=lambda n: n.metadata.name, reverse=True):
            if have - self.pools.gpus(node) < wanted:
                continue
            self.pools.set_pool(node, "training")
            inference.remove(node)
            have -= self.pools.gpus(node)
        return have

    def apply(self, decision: BrokerDecision) -> Applied:
        started = self.clock()
        nodes = self.gpu_nodes()
        total = sum(self.pools.gpus(n) for n in nodes)
        inference = [n for n in nodes if self.pools.pool(n) == "inference"]
        training = [n for n in nodes if self.pools.pool(n) != "inference"]
        have = sum(self.pools.gpus(n) for n in inference)
        done = PodEvictions()
        wanted, note = decision.inference_gpus, ""
        if self.rules is not None:
            wanted, note = self.rules.within_rules(wanted, total)
        if wanted > have and self.rules is not None:
            have, done, short = self.rules.take(
                training, inference, have=have, wanted=wanted, total=total, started=started
            )
            note += short
        elif wanted > have:
            have, done, short = self._grow(
                decision, training, inference, have=have, wanted=wanted, started=started
            )
            note += short
        elif wanted < have:
            have = self._shrink(inference, have=have, wanted=wanted)
        self.inference.scale(have)
        returned = {n.metadata.name for n in nodes if self.pools.pool(n) == "inference"}
        returned -= {n.metadata.name for n in inference}
        moved = self.inference.vacate(returned, self.evictor, started + self.grace_s)
        if moved.refused:
            note += f"; inference's PDB kept replicas on {few(sorted(moved.kept_on))}"
        quota = self._set_training_quota(total - have)
        applied = self._applied(inference, done, note, have=have, total=total, quota=quota)
        return dataclasses.replace(applied, moved_replicas=tuple(moved.evicted))

    @staticmethod
    def _applied(
        inference: list[Any], done: PodEvictions, note: str, *, have: int, total: int, quota: int
    ) -> Applied:
        return Applied(
            have,
            f"inference {have}/{total} GPUs on {len(inference)} node(s)"
            + note
            + (f"; PDB kept {', '.join(done.refused)}" if done.refused else "")
            + (
                f"; training queue capability held at its deserved {quota} "
                f"({total - have} GPUs lent)"
                if quota > total - have
                else ""
            ),
            stopped_gpus=done.gpus,
            inference_nodes=tuple(n.metadata.name for n in inference),
            evicted_pods=tuple(done.evicted),
            refused_by_pdb=tuple(done.refused),
        )
