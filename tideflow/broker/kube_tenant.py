"""The broker as the tenant ``inference`` of its cluster file, on a cluster.

When its cluster file (``TIDEFLOW_CLUSTER_FILE``) declares a team ``inference``,
the broker is that team's tenant, as locally (``tideflow.broker.tenant``): it holds
at most inference's nominal quota and lends no more of it than inference's rules
let anyone borrow (the compiled queues lend the pool to any team); growing back,
it stops only gangs that borrow inference's quota, read from their pods' team
label (``tideflow.io/team``), each evicted with its rule's grace: the PDB's
refusals are retried that long and the pods get that long to stop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from tideflow.broker.kube_evictions import Evictor, PodEvictions
from tideflow.broker.kube_pools import NodePools
from tideflow.broker.kube_target import POOL, few
from tideflow.broker.tenant import (
    INFERENCE_TEAM,
    PoolNode,
    borrowers,
    capped,
    ceiling,
    floor,
    grow,
    lendable,
)
from tideflow.compile.cluster_names import POOL_LABEL
from tideflow.inventory import ClusterSpec
from tideflow.scheduling.model import DeviceClass
from tideflow.scheduling.quota import Eviction, Key, Teams
from tideflow.steps.context import GANG_LABEL


def pool_model(spec: ClusterSpec, device_class: DeviceClass) -> str | None:
    """The device model of the broker's pool in the cluster file: of the node groups
    labelled ``tideflow.io/pool: training`` (else of every group of the class), when they
    are one model; None (the class-wide quota) otherwise."""
    groups = [
        g for g in spec.nodes if g.accelerators and g.accelerators.device_class == device_class
    ]
    pool = [g for g in groups if g.labels.get(POOL_LABEL) == POOL] or groups
    models = {g.accelerators.model for g in pool if g.accelerators}
    return models.pop() if len(models) == 1 else None


@dataclass(frozen=True)
class Growth:
    """The nodes to take, the gangs to evict first, and why it falls short, where it does."""

    nodes: list[Any]
    evictions: tuple[Eviction, ...]
    why: list[str]


class InferenceTenant:
    def __init__(
        self,
        teams: Teams,
        model: str | None,
        device_class: DeviceClass,
        pools: NodePools,
        evictor: Evictor,
    ) -> None:
        self.teams = teams
        self.model = model
        self.device_class = device_class
        self.pools = pools
        self.evictor = evictor

    def key(self) -> Key:
        return self.teams.key(INFERENCE_TEAM, self.device_class, self.model)

    def within_rules(self, wanted: int, total: int) -> tuple[int, str]:
        """The GPUs to hold for a decision of ``wanted``: at most inference's quota, and
        no less than the part of it inference's rules let nobody borrow (the compiled
        queues would lend it to any team), with the note's words for either."""
        key = self.key()
        target, note = capped(wanted, ceiling(self.teams, key, total))
        least = floor(self.teams, key, total)
        if target < least:
            target = least
            note += (
                f"; held at {least}: inference's rules lend at most "
                f"{lendable(self.teams, key)} of its quota of "
                f"{self.teams.nominal(INFERENCE_TEAM, key)}"
            )
        return target, note

    def _pool_nodes(
        self, training: list[Any], pods: list[Any], unusable: set[str]
    ) -> list[PoolNode]:
        """The usable training nodes with the gangs on each."""
        on_node: dict[str, set[str]] = {}
        for pod in pods:
            # A pod of no gang is never evicted: named as a gang no rule lets anyone
            # stop, it keeps its node training's as a non-borrowing gang would.
            gang = (pod.metadata.labels or {}).get(GANG_LABEL) or f"pod {pod.metadata.name}"
            on_node.setdefault(pod.spec.node_name, set()).add(gang)
        return [
            PoolNode(
                n.metadata.name, self.pools.gpus(n), frozenset(on_node.get(n.metadata.name, ()))
            )
            for n in training
            if n.metadata.name not in unusable
        ]

    def plan_growth(self, training: list[Any], have: int, target: int, total: int) -> Growth:
        """The nodes to take and the gangs to evict first, by the lender's reclaim; why
        it falls short, where it does.

        The policy's own victims are not used: they may run within their team's quota.
        A gang on the pool is stopped only when the teams' rules, replayed over the
        gangs in the order they started, say it borrows what inference lends (or what
        the rules return after auto_return_timeout), exactly as the ledger would stop
        it locally. A gang beyond its team's quota that no rule lets borrow of
        inference is not stopped either: it holds what no rule gives inference a claim
        on (the shared pool, another team's idle quota) or what the engine's queues let
        it take outside the rules, and the broker acts within the rules, not as their
        judge. The nodes such gangs run on stay training's, and the note names them.
        """
        pods = self.pools.training_pods()
        now = time.time()
        unusable = self.pools.unusable_nodes()
        gangs = self.pools.gangs(pods, self.teams.teams)
        held = borrowers(self.teams, gangs, have, self.device_class, self.model, now=now)
        growth = grow(
            self.teams,
            held,
            self._pool_nodes(training, pods, unusable),
            have=have,
            target=target,
            most=ceiling(self.teams, self.key(), total),
            device_class=self.device_class,
            model=self.model,
            now=now,
        )
        by_name = {n.metadata.name: n for n in training}
        nodes = [by_name[name] for name in growth.nodes]
        why: list[str] = []
        if have + sum(self.pools.gpus(n) for n in nodes) < target:
            why = self._shortfall(training, growth.kept_by, unusable)
        return Growth(nodes, growth.evictions, why)

    @staticmethod
    def _shortfall(training: list[Any], kept_by: Any, unusable: set[str]) -> list[str]:
        why = []
        if kept_by:
            why.append(
                "the nodes left run gangs or pods inference may not reclaim (" + few(kept_by) + ")"
            )
        skipped = sorted(n.metadata.name for n in training if n.metadata.name in unusable)
        if skipped:
            why.append(f"cordoned or not Ready: {few(skipped)}")
        if not why:
            why.append("no whole node left within inference's quota")
        return why

    def take(
        self,
        training: list[Any],
        inference: list[Any],
        *,
        have: int,
        wanted: int,
        total: int,
        started: float,
    ) -> tuple[int, PodEvictions, str]:
        """Grow as inference's tenant: evict the borrowers, then take the nodes they
        emptied (appended to ``inference``). The GPUs held then, what the evictions did,
        and the note's words when it falls short."""
        growth = self.plan_growth(training, have, wanted, total)
        done = PodEvictions()
        for eviction in growth.evictions:  # each waits its own rule's grace
            done.add(
                self.evictor.evict_gang(
                    eviction.gang_id, started + eviction.grace_s, eviction.grace_s
                )
            )
        # A node still busy after the evictions is not taken: a PDB kept its gang past
        # the grace, or while the broker waited a pod was placed on it or it was
        # cordoned.
        busy = self.pools.busy_nodes() if growth.evictions else set()
        for node in growth.nodes:
            if node.metadata.name in busy:
                continue
            self.pools.set_pool(node, "inference")
            inference.append(node)
            have += self.pools.gpus(node)
        why = growth.why + self._kept(growth.nodes, busy, done)
        note = f"; {wanted - have} GPUs short: " + "; ".join(why) if have < wanted else ""
        return have, done, note

    @staticmethod
    def _kept(taking: list[Any], busy: set[str], done: PodEvictions) -> list[str]:
        """Why nodes meant for inference stayed training's after the evictions."""
        kept = sorted(n.metadata.name for n in taking if n.metadata.name in done.kept_on)
        other = sorted(
            n.metadata.name
            for n in taking
            if n.metadata.name in busy and n.metadata.name not in done.kept_on
        )
        why = []
        if kept:
            why.append(f"a PDB kept pods on {few(kept)}")
        if other:
            why.append(f"{few(other)} became busy, cordoned or not Ready during the wait")
        return why
