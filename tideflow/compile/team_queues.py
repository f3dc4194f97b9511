"""A cluster file's teams as per-flavor shares: what the Kueue and Volcano compilers share.

The ledger (``tideflow.scheduling.quota``) keeps quotas per device class and
model, borrowing per lender and borrower. A cluster engine keeps quotas per
ResourceFlavor (Kueue) or per resource name (Volcano), and borrowing per queue.
This module turns the declaration into what both can hold, and names what they
cannot:

* one flavor per device class and model the nodes declare (``cpu`` for the
  CPU), its node labels those every node group of it carries;
* each team's share of each flavor: its quota for that model, plus its share of
  a class-wide quota, split over the class's models by their device counts;
* the borrowing rules folded into per-queue bounds that never allow more than
  the ledger could: a borrower borrows at most the shared pool plus what each
  of its lenders may lend it (``max_borrowable_ratio`` of their nominal, within
  their ``lending_limit``), and a lender lends at most what its rules, summed,
  let anyone borrow (nothing when it lends to no team);
* the broker's pool: flavors whose node groups carry ``tideflow.io/pool:
  training`` are the GPUs ``tideflow.broker`` moves between inference and
  training, held by one lending queue (``training``) whose quota the broker
  sets (``tideflow.broker.kubernetes``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from tideflow.compile.cluster_names import (
    BROKER_POOL,
    MODEL_LABELS,
    POOL_LABEL,
    QUOTA_RESOURCES,
    TRAINING_QUEUE,
)
from tideflow.compile.gpu_products import gpu_products
from tideflow.inventory import ClusterSpec, NodeGroup
from tideflow.spec.teams import BorrowingRule, Team, device_label


class QueueCompileError(ValueError):
    """The cluster file's teams cannot be compiled for the engine (the reason says why)."""


@dataclass(frozen=True)
class Flavor:
    name: str
    device_class: str
    model: str | None
    devices: int  # devices (cores, for the CPU) of the node groups it stands for
    memory: int  # bytes on those node groups (cpu flavor only; 0: not declared)
    node_labels: tuple[tuple[str, str], ...]
    broker: bool  # the broker's pool: its quota moves with inference

    @property
    def resource(self) -> str:
        return QUOTA_RESOURCES[self.device_class]

    @property
    def label(self) -> str:
        return device_label(self.device_class, self.model)


@dataclass(frozen=True)
class Share:
    """One team's share of one flavor, the borrowing rules folded in."""

    nominal: int
    borrowing_limit: int | None  # most it may use beyond nominal; None: no bound
    lending_limit: int | None  # most of nominal others may use while idle; None: all of it


@dataclass(frozen=True)
class TeamQueuePlan:
    cluster: str
    flavors: tuple[Flavor, ...]
    teams: tuple[str, ...]
    shares: dict[str, dict[str, Share]]  # team -> flavor name -> share
    shared_pool: dict[str, int]  # flavor name -> devices no team's nominal covers
    spec: ClusterSpec
    notes: list[str] = field(default_factory=list)  # what both engines cannot express

    def flavor(self, name: str) -> Flavor:
        return next(f for f in self.flavors if f.name == name)

    @property
    def broker_flavors(self) -> tuple[Flavor, ...]:
        return tuple(f for f in self.flavors if f.broker)


_MEMORY = re.compile(r"^([0-9.]+)(Ki|Mi|Gi|Ti|Pi|Ei|k|K|M|G|T|P|E|m)?$")
_FACTORS = {
    None: 1,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}


def memory_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity in bytes ('256Gi' -> 274877906944)."""
    found = _MEMORY.match(str(quantity))
    if not found:
        raise QueueCompileError(f"'{quantity}' is not a memory quantity")
    number, suffix = found.groups()
    if suffix == "m":
        return math.ceil(float(number) / 1000)
    return math.ceil(float(number) * _FACTORS[suffix])


def memory_quantity(value: int) -> str | int:
    """Bytes written the way a person would ('256Gi'), or as bytes when not whole."""
    if value == 0:
        return 0
    for suffix in ("Ti", "Gi", "Mi", "Ki"):
        if value and value % _FACTORS[suffix] == 0:
            return f"{value // _FACTORS[suffix]}{suffix}"
    return value


def priority_class_name(priority_class: str) -> str:
    """The name of what ``tideflow compile`` makes of a cluster file's priority class:
    Kueue's WorkloadPriorityClass and Volcano's (scheduling.k8s.io/v1) PriorityClass alike.

    A gang of that class names it by this (``tideflow.kube.jobset``'s label
    ``kueue.x-k8s.io/priority-class``, ``tideflow.kube.volcano``'s Job
    ``priorityClassName``). It is the class's own name: a cluster file's ``Name`` is
    already a DNS-1123 label (``tideflow.spec.fields``).
    """
    return priority_class


def flavor_name(device_class: str, model: str | None) -> str:
    """A ResourceFlavor name (a DNS subdomain): 'cpu', or the model lower-cased ('h100')."""
    if model is None:
        return device_class
    name = re.sub(r"[^a-z0-9.-]+", "-", model.lower()).strip("-.")
    return name or device_class


def _common_labels(groups: Iterable[NodeGroup]) -> dict[str, str]:
    groups = list(groups)
    if not groups:
        return {}
    common = dict(groups[0].labels)
    for group in groups[1:]:
        common = {k: v for k, v in common.items() if group.labels.get(k) == v}
    return common


def _flavors(spec: ClusterSpec) -> tuple[Flavor, ...]:
    """One flavor per accelerator model the nodes declare, and ``cpu``.

    The CPU flavor stands for the node groups without accelerators when there
    are any (where CPU gangs belong), else for every node.
    """
    by_model: dict[tuple[str, str], list[NodeGroup]] = {}
    for group in spec.nodes:
        acc = group.accelerators
        if acc is not None:
            by_model.setdefault((acc.device_class, acc.model), []).append(group)
    flavors = []
    names: dict[str, tuple[str, str]] = {}
    for (device_class, model), groups in sorted(by_model.items()):
        name = flavor_name(device_class, model)
        if name in names or name == "cpu":
            raise QueueCompileError(
                f"models {names.get(name, ('cpu', 'cpu'))[1]!r} and {model!r} both make the "
                f"flavor name {name!r}: name the models so that they differ in lower case"
            )
        names[name] = (device_class, model)
        product = dict(gpu_products()).get(model, model)
        labels = _common_labels(groups) or {MODEL_LABELS[device_class]: product}
        broker = all(g.labels.get(POOL_LABEL) == BROKER_POOL for g in groups)
        devices = sum(g.count * g.accelerators.count for g in groups if g.accelerators)
        flavors.append(
            Flavor(name, device_class, model, devices, 0, tuple(sorted(labels.items())), broker)
        )
    plain = [g for g in spec.nodes if g.accelerators is None] or list(spec.nodes)
    cores = sum(g.count * g.cpu for g in plain)
    memory = sum(g.count * memory_bytes(g.memory) for g in plain)
    labels = _common_labels(plain)
    cpu = Flavor("cpu", "cpu", None, cores, memory, tuple(sorted(labels.items())), False)
    # The broker's flavors first: a gang that names no model takes the lent GPUs first.
    return (cpu, *sorted(flavors, key=lambda f: (not f.broker, f.name)))


def _split(total: int | None, weights: list[int]) -> list[int | None]:
    """``total`` split in proportion to ``weights`` (largest remainder; None stays None)."""
    if total is None:
        return [None] * len(weights)
    whole = sum(weights)
    if whole == 0:
        return [0] * len(weights)
    exact = [total * w / whole for w in weights]
    parts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (parts[i] - exact[i], i))
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    return list(parts)


def _merge(
    a: tuple[int, int | None, int | None], b: tuple[int, int | None, int | None]
) -> tuple[int, int | None, int | None]:
    """A model's own quota and its part of a class-wide one, on one flavor: nominal summed;
    no borrowing bound if either has none; lending summed (an unset one lends its nominal)."""
    borrow = None if a[1] is None or b[1] is None else a[1] + b[1]
    if a[2] is None and b[2] is None:
        lend = None
    else:
        lend = (a[0] if a[2] is None else a[2]) + (b[0] if b[2] is None else b[2])
    return (a[0] + b[0], borrow, lend)


def plan_team_queues(spec: ClusterSpec) -> TeamQueuePlan:
    """Each team's share of each flavor; ``QueueCompileError`` when no team is declared."""
    if not spec.teams:
        raise QueueCompileError(
            f"cluster {spec.metadata.name} declares no teams: there are no quotas to compile "
            "into queues. Declare at least one team under 'teams' (one team whose quotas "
            "cover every device is one shared queue)"
        )
    flavors = _flavors(spec)
    notes: list[str] = []
    declared = {team.name: _declared_quotas(team, flavors, notes) for team in spec.teams}
    shared = {
        f.name: max(0, f.devices - sum(q.get(f.name, _NO_QUOTA)[0] for q in declared.values()))
        for f in flavors
    }
    shares = {
        team.name: _team_shares(team.name, flavors, declared, shared, list(spec.borrowing))
        for team in spec.teams
    }
    return TeamQueuePlan(
        spec.metadata.name,
        flavors,
        tuple(t.name for t in spec.teams),
        shares,
        shared,
        spec,
        notes,
    )


# A team's quota of one flavor as declared: (nominal, borrowing_limit, lending_limit).
_Declared = tuple[int, int | None, int | None]
_NO_QUOTA: _Declared = (0, None, None)


def _declared_quotas(
    team: Team, flavors: tuple[Flavor, ...], notes: list[str]
) -> dict[str, _Declared]:
    """The team's quotas per flavor; a class-wide quota split over the class's models by
    their device counts (with a note: the engines keep quotas per model)."""
    mine: dict[str, _Declared] = {}
    for quota in team.quota:
        if quota.model is not None and quota.device != "cpu":
            of_class = [f for f in flavors if f.name == flavor_name(quota.device, quota.model)]
        else:  # class-wide: over every model of the class, by device count
            of_class = [f for f in flavors if f.device_class == quota.device]
        weights = [f.devices for f in of_class]
        parts = zip(
            of_class,
            _split(quota.nominal, weights),
            _split(quota.borrowing_limit, weights),
            _split(quota.lending_limit, weights),
            strict=True,
        )
        for flavor, nominal, borrow, lend in parts:
            entry = (int(nominal or 0), borrow, lend)
            mine[flavor.name] = _merge(mine[flavor.name], entry) if flavor.name in mine else entry
        if len(of_class) > 1:
            split = ", ".join(
                f"{f.name} {n}"
                for f, n in zip(of_class, _split(quota.nominal, weights), strict=True)
            )
            notes.append(
                f"team {team.name}: its class-wide {quota.label()} quota of {quota.nominal} "
                f"is split over the models by their device counts ({split}): the engines "
                "keep quotas per model; tideflow's ledger lets one quota span the models"
            )
    return mine


def _team_shares(
    team: str,
    flavors: tuple[Flavor, ...],
    declared: dict[str, dict[str, _Declared]],
    shared: dict[str, int],
    rules: list[BorrowingRule],
) -> dict[str, Share]:
    """The team's share of each flavor it has a stake in or may borrow."""
    shares: dict[str, Share] = {}
    for flavor in flavors:
        nominal, borrow, lend = declared[team].get(flavor.name, _NO_QUOTA)
        stake = flavor.name in declared[team]
        if flavor.broker:
            # The broker lends the pool to training as a whole: the teams borrow it from
            # the training queue, never from each other, so the rules bound nothing here.
            if stake or shared[flavor.name] > 0:
                limit = borrow if stake else shared[flavor.name] - nominal
                shares[flavor.name] = Share(nominal, limit, None)
            continue
        lenders = 0
        for rule in (r for r in rules if r.borrower == team):
            l_nominal, _, l_lend = declared.get(rule.lender, {}).get(flavor.name, _NO_QUOTA)
            cap = l_nominal if l_lend is None else min(l_lend, l_nominal)
            lenders += min(cap, math.floor(rule.max_borrowable_ratio * l_nominal))
        ceiling = shared[flavor.name] + lenders
        borrowable = ceiling if borrow is None else min(borrow, ceiling)
        given = [r for r in rules if r.lender == team]
        by_rules = sum(math.floor(r.max_borrowable_ratio * nominal) for r in given)
        lendable = min(nominal if lend is None else lend, by_rules, nominal)
        if nominal == 0 and borrowable == 0:
            continue
        shares[flavor.name] = Share(
            nominal,
            None if nominal + borrowable >= flavor.devices else borrowable,
            None if lendable >= nominal else lendable,
        )
    return shares


BROKER_NOTE = (
    "The broker (tideflow/broker/kubernetes.py) moves the nodes labelled "
    f"{POOL_LABEL}={BROKER_POOL} between inference and training, and with them the quota of "
    f"the queue '{TRAINING_QUEUE}', which holds them: Kueue's nominalQuota of that flavor "
    "(TIDEFLOW_K8S_KUEUE_FLAVOR), or Volcano's capability, never below its deserved. Label "
    f"those nodes {POOL_LABEL}={BROKER_POOL} once before the broker's first start."
)


def comment_block(title: str, warnings: list[str], about: str = "") -> str:
    """The warnings as YAML comments above the documents, one rule a paragraph."""
    import textwrap

    lines = [f"# {line}" for line in textwrap.wrap(title, width=88)] + ["#"]
    if about:
        lines += [f"# {line}" for line in textwrap.wrap(about, width=88)] + ["#"]
    if not warnings:
        lines.append("# Every rule of the cluster file is expressed by these objects.")
    else:
        lines.append("# Rules these objects cannot express, and what tideflow does instead:")
        for warning in warnings:
            wrapped = textwrap.wrap(warning, width=86)
            lines.append(f"# * {wrapped[0]}")
            lines += [f"#   {line}" for line in wrapped[1:]]
    return "\n".join(lines) + "\n"


def render(header: str, objects: list[dict[str, object]]) -> str:
    """Multi-document YAML: the header comments, then one document per object."""
    import yaml

    documents = [
        yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=100) for obj in objects
    ]
    return header + "---\n" + "---\n".join(documents)
