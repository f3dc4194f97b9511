"""Gangs and inference placed on the simulated cluster's nodes, not counted in GPUs.

Counting GPUs flatters the broker: a gang of 4 fits "4 idle GPUs" spread over
four nodes, and inference grows into idle GPUs that no whole node holds. With
``ResearchConfig.placement = "nodes"`` (``research.broker.simulate``) the simulator
places each gang as a gang scheduler packing its pool would (``NodePool.place``): a gang of whole
nodes on empty nodes, a smaller one, or a remainder, on the fullest node it
fits (best fit), and inference on whole empty nodes. When inference grows and
the victims the policy chose, reasoning in counts, leave too few empty nodes,
the gangs on the nodes cheapest to empty are stopped as well
(``NodePool.to_empty``), as a node-moving actuator does; the simulator counts
them as placement preemptions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class NodePool:
    """``nodes`` nodes of ``node_gpus`` GPUs; ``inference`` of them whole for inference."""

    def __init__(self, nodes: int, node_gpus: int) -> None:
        self.node_gpus = node_gpus
        self.free = [node_gpus] * nodes  # free GPUs per node (an inference node: 0)
        self.inference: set[int] = set()
        self.placed: dict[str, dict[int, int]] = {}  # gang -> node -> GPUs

    def training_nodes(self) -> list[int]:
        return [n for n in range(len(self.free)) if n not in self.inference]

    def empty(self) -> list[int]:
        """Training nodes no gang holds."""
        return [n for n in self.training_nodes() if self.free[n] == self.node_gpus]

    def place(self, gang: str, gpus: int) -> bool:
        """Place a gang whole, or not at all: whole empty nodes for each full node's
        worth of its GPUs, the remainder on the fullest training node it fits."""
        whole, rest = divmod(gpus, self.node_gpus)
        empty = self.empty()
        if len(empty) < whole:
            return False
        taken = dict.fromkeys(empty[:whole], self.node_gpus)
        if rest:
            fits = [n for n in self.training_nodes() if n not in taken and self.free[n] >= rest]
            if not fits:
                return False
            best = min(fits, key=lambda n: (self.free[n], n))
            taken[best] = rest
        for node, count in taken.items():
            self.free[node] -= count
        self.placed[gang] = taken
        return True

    def release(self, gang: str) -> None:
        for node, count in self.placed.pop(gang, {}).items():
            self.free[node] += count

    def resize(self, gang: str, gpus: int) -> bool:
        """Shrink a running gang, giving back its GPUs on the nodes where it has fewest
        first, or grow it into free GPUs on training nodes, its own nodes first; False
        (nothing changed) when too few are free."""
        held = self.placed[gang]
        change = gpus - sum(held.values())
        if change <= 0:
            for node in sorted(held, key=lambda n: (held[n], n)):
                give = min(held[node], -change)
                held[node] -= give
                self.free[node] += give
                change += give
                if held[node] == 0:
                    del held[node]
            return True
        nodes = sorted(
            (n for n in self.training_nodes() if self.free[n] > 0),
            key=lambda n: (n not in held, -self.free[n], n),
        )
        if sum(self.free[n] for n in nodes) < change:
            return False
        for node in nodes:
            take = min(self.free[node], change)
            self.free[node] -= take
            held[node] = held.get(node, 0) + take
            change -= take
            if change == 0:
                break
        return True

    def inference_to(self, gpus: int) -> int:
        """Move inference to ``gpus`` (whole nodes) as far as empty nodes allow: lending
        gives back its highest nodes, growing takes the lowest empty ones. The GPUs it
        holds after."""
        wanted = gpus // self.node_gpus
        for node in sorted(self.inference, reverse=True)[: max(0, len(self.inference) - wanted)]:
            self.inference.discard(node)
            self.free[node] = self.node_gpus
        for node in self.empty()[: max(0, wanted - len(self.inference))]:
            self.inference.add(node)
            self.free[node] = 0
        return len(self.inference) * self.node_gpus

    def to_empty(self, nodes: int, cost: Mapping[str, float]) -> list[str]:
        """The gangs to stop so that ``nodes`` more training nodes are empty: those on
        the nodes cheapest to empty (the sum of the ``cost`` of the gangs on each, in
        GPU-seconds a stop would lose), cheapest first."""
        short = nodes - len(self.empty())
        if short <= 0:
            return []
        on: dict[int, set[str]] = {}
        for gang, held in self.placed.items():
            for node in held:
                on.setdefault(node, set()).add(gang)
        busy = sorted(on, key=lambda n: (sum(cost[g] for g in on[n]), len(on[n]), n))
        chosen: list[str] = []
        for node in busy:
            # a gang spanning several nodes empties them all: count what is empty now
            if sum(1 for gangs in on.values() if gangs <= set(chosen)) >= short:
                break
            chosen += sorted(on[node] - set(chosen))
        return chosen


class NodePlacement:
    """The simulator's ``Placement`` on a ``NodePool``: gangs and inference on nodes, and
    the gangs stopped only to empty nodes counted as placement preemptions."""

    def __init__(self, nodes: int, node_gpus: int, *, node_aware: bool = True) -> None:
        self.pool = NodePool(nodes, node_gpus)
        # True: the policy sees the nodes and chooses victims that empty whole ones.
        self.node_aware = node_aware
        self.preemptions = 0  # stopped beyond the policy's victims, to empty nodes

    def inference_to(self, gpus: int) -> int:
        return self.pool.inference_to(gpus)

    def place(self, gang: str, gpus: int, free: int) -> bool:
        return self.pool.place(gang, gpus)

    def resize(self, gang: str, gpus: int) -> bool:
        return self.pool.resize(gang, gpus)

    def release(self, gang: str) -> None:
        self.pool.release(gang)

    def nodes(self, gang: str) -> tuple[str, ...]:
        return tuple(str(n) for n in self.pool.placed[gang])

    def empty_nodes(self) -> int | None:
        return len(self.pool.empty()) if self.node_aware else None

    def to_empty(self, inference_gpus: int, cost: Mapping[str, float]) -> list[str]:
        # The victims were chosen by count: empty whole nodes for the rest.
        grow = inference_gpus // self.pool.node_gpus - len(self.pool.inference)
        chosen = self.pool.to_empty(grow, cost) if grow > 0 else []
        self.preemptions += len(chosen)
        return chosen

    def metrics(self) -> dict[str, Any]:
        return {"placement_preemptions": self.preemptions}
