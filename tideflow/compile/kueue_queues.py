"""A cluster file's teams as Kueue objects (``tideflow compile --target kueue``).

What maps, read from Kueue's API and docs (kubernetes-sigs/kueue
apis/kueue/v1beta2/clusterqueue_types.go; site/content/en/docs/concepts/
cluster_queue.md, preemption.md, workload_priority_class.md; the ClusterQueue
webhook pkg/webhooks/clusterqueue_webhook.go):

* a priority class -> a WorkloadPriorityClass of the same name and value
  (``priority_class_name``), which a gang of that class names in its JobSet's label
  ``kueue.x-k8s.io/priority-class`` (``tideflow.kube.jobset``);
* the node groups of a device model -> a ResourceFlavor whose nodeLabels are the
  labels they share; the CPU -> flavor ``cpu`` (with memory when nodes declare it);
* the teams -> one Cohort (named after the cluster) and one ClusterQueue per team
  in it, with one LocalQueue each in the namespace gangs run in; devices no team's
  nominal covers (the ledger's shared pool) are the Cohort's own nominalQuota,
  which every member may borrow;
* a team's share of a flavor -> nominalQuota; borrowingLimit and lendingLimit
  with the borrowing rules folded in (``tideflow.compile.team_queues``);
* preemption: a team within its nominal reclaims from any member above its own,
  whatever the borrower's priority (``reclaimWithinCohort: Any``); when a class
  the team may use ``preempts``, ``withinClusterQueue`` and ``borrowWithinCohort``
  are ``LowerPriority``;
* the broker's pool -> ClusterQueue ``training``, which admits nothing (no
  namespaceSelector) and lends the pool's devices to the cohort; the broker sets its
  nominalQuota (``tideflow.broker.kubernetes``). Teams own none of it (a nominal
  quota cannot follow a pool that inference may take whole) and borrow it up to
  their nominal plus their borrowing_limit.
"""

from __future__ import annotations

from typing import Any

from tideflow.compile.cluster_names import NAMESPACE, POOL_LABEL, TRAINING_QUEUE
from tideflow.compile.engine_warnings import BorrowingWords, borrowing_warnings, budget_warning
from tideflow.compile.team_queues import (
    BROKER_NOTE,
    Flavor,
    QueueCompileError,
    Share,
    TeamQueuePlan,
    comment_block,
    memory_quantity,
    plan_team_queues,
    priority_class_name,
    render,
)
from tideflow.inventory import ClusterSpec
from tideflow.spec.teams import PriorityClass

API = "kueue.x-k8s.io/v1beta2"


def _quota(flavor: Flavor, resource: str, share: Share, scale: float = 1.0) -> dict[str, Any]:
    """One resource's quota entry; memory follows the CPU quota at the nodes' ratio."""

    def amount(value: int) -> int | str:
        if resource == "memory":
            return memory_quantity(int(value * scale))
        return value

    entry: dict[str, Any] = {"name": resource, "nominalQuota": amount(share.nominal)}
    if share.borrowing_limit is not None:
        entry["borrowingLimit"] = amount(share.borrowing_limit)
    if share.lending_limit is not None:
        entry["lendingLimit"] = amount(share.lending_limit)
    return entry


def _covered(flavor: Flavor) -> list[str]:
    if flavor.device_class == "cpu" and flavor.memory:
        return ["cpu", "memory"]
    return [flavor.resource]


def _resource_groups(plan: TeamQueuePlan, shares: dict[str, Share]) -> list[dict[str, Any]]:
    """One group per device class (a flavor belongs to one group), flavors in plan order."""
    groups: list[dict[str, Any]] = []
    for device_class in ("gpu", "npu", "cpu"):
        flavors = [f for f in plan.flavors if f.device_class == device_class and f.name in shares]
        if not flavors:
            continue
        covered = _covered(flavors[0])
        entries = []
        for flavor in flavors:
            scale = flavor.memory / flavor.devices if flavor.devices else 0.0
            entries.append(
                {
                    "name": flavor.name,
                    "resources": [_quota(flavor, r, shares[flavor.name], scale) for r in covered],
                }
            )
        groups.append({"coveredResources": covered, "flavors": entries})
    return groups


def _team_shares(plan: TeamQueuePlan, team: str) -> dict[str, Share]:
    """The team's shares as its ClusterQueue holds them: none of the broker's pool."""
    found = {}
    for name, share in plan.shares[team].items():
        if plan.flavor(name).broker:
            limit = share.borrowing_limit
            total = None if limit is None else share.nominal + limit
            found[name] = Share(0, total, None)
        else:
            found[name] = share
    return found


def _preempting(plan: TeamQueuePlan, team: str) -> tuple[bool, bool]:
    """(a class the team may use preempts, every class above another of them preempts)."""
    declared = next(t for t in plan.spec.teams if t.name == team)
    allowed = [
        c
        for c in plan.spec.priority_classes
        if declared.priority_classes is None or c.name in declared.priority_classes
    ]
    lowest = min((c.value for c in allowed), default=0)
    some = any(c.preempts for c in allowed)
    exact = all(c.preempts for c in allowed if c.value > lowest)
    return some, exact


def kueue_objects(
    spec: ClusterSpec, *, namespace: str = NAMESPACE
) -> tuple[list[dict[str, Any]], list[str]]:
    """The Kueue objects for a cluster file's teams, and the rules they cannot express."""
    plan = plan_team_queues(spec)
    if plan.broker_flavors and TRAINING_QUEUE in plan.teams:
        raise QueueCompileError(
            f"team '{TRAINING_QUEUE}' has the name of the ClusterQueue the broker moves "
            "(its lent GPUs): rename the team"
        )
    warnings = list(plan.notes) + _warnings(plan)
    objects = [_priority_class(c) for c in plan.spec.priority_classes]
    objects += [_resource_flavor(f) for f in plan.flavors if f.devices]
    objects += _cohort(plan)
    objects += [_team_queue(plan, team, namespace) for team in plan.teams]
    objects += [
        _object("LocalQueue", team, {"clusterQueue": team}, namespace) for team in plan.teams
    ]
    return objects, warnings


def _object(
    kind: str, name: str, spec: dict[str, Any], namespace: str | None = None
) -> dict[str, Any]:
    metadata = {"name": name} if namespace is None else {"name": name, "namespace": namespace}
    return {"apiVersion": API, "kind": kind, "metadata": metadata, "spec": spec}


def _priority_class(declared: PriorityClass) -> dict[str, Any]:
    wpc: dict[str, Any] = {
        "apiVersion": API,
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": priority_class_name(declared.name)},
        "value": declared.value,
    }
    if declared.description:
        wpc["description"] = declared.description
    return wpc


def _resource_flavor(flavor: Flavor) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeLabels": dict(flavor.node_labels)}
    if flavor.broker:
        # The broker taints the nodes it manages (key tideflow.io/pool, NoSchedule);
        # Kueue adds this toleration to the pods it admits on this flavor.
        spec["tolerations"] = [{"key": POOL_LABEL, "operator": "Exists", "effect": "NoSchedule"}]
    if not spec["nodeLabels"]:
        del spec["nodeLabels"]
    return _object("ResourceFlavor", flavor.name, spec)


def _cohort(plan: TeamQueuePlan) -> list[dict[str, Any]]:
    """The cohort, with the shared pool as its own quota, and the broker's training queue."""
    # Cohort-level nominalQuota is "additional resources on top of those defined by
    # ClusterQueues within the Cohort" (the Cohort CRD), lent to every member.
    pool = {
        name: Share(devices, None, None)
        for name, devices in plan.shared_pool.items()
        if devices and not plan.flavor(name).broker
    }
    cohort_spec: dict[str, Any] = {}
    if pool:
        cohort_spec["resourceGroups"] = _resource_groups(plan, pool)
    objects = [_object("Cohort", plan.cluster, cohort_spec)]
    if plan.broker_flavors:
        lent = {f.name: Share(f.devices, None, None) for f in plan.broker_flavors}
        # No namespaceSelector: it admits no workload; all it holds is lent.
        lent_spec = {"cohortName": plan.cluster, "resourceGroups": _resource_groups(plan, lent)}
        objects.append(_object("ClusterQueue", TRAINING_QUEUE, lent_spec))
    return objects


def _team_queue(plan: TeamQueuePlan, team: str, namespace: str) -> dict[str, Any]:
    some, _ = _preempting(plan, team)
    preemption: dict[str, Any] = {
        # the ledger's reclaim (tideflow.scheduling.reclaim): a queue within its nominal
        # takes devices back from any member above its own, whatever the priority
        "reclaimWithinCohort": "Any",
        "borrowWithinCohort": {"policy": "LowerPriority" if some else "Never"},
        "withinClusterQueue": "LowerPriority" if some else "Never",
    }
    spec: dict[str, Any] = {
        "cohortName": plan.cluster,
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        # StrictFIFO would reserve at once; reserve_after waits first (a warning)
        "queueingStrategy": "BestEffortFIFO",
        "preemption": preemption,
        "resourceGroups": _resource_groups(plan, _team_shares(plan, team)),
    }
    if plan.spec.scheduling.fair_sharing and plan.broker_flavors:
        # On the broker's pool the teams own no nominal quota: the weights give each
        # its nominal share of it when Kueue's fair sharing is on.
        shares = plan.shares[team]
        weight = sum(shares.get(f.name, Share(0, 0, 0)).nominal for f in plan.broker_flavors)
        spec["fairSharing"] = {"weight": weight}
    if not spec["resourceGroups"]:
        del spec["resourceGroups"]
    return _object("ClusterQueue", team, spec)


# What Kueue makes of the borrowing rules (tideflow.compile.engine_warnings).
BORROWING = BorrowingWords(
    ratios="a Kueue cohort lends any member's idle quota to any other. Folded "
    "into each borrower's borrowingLimit (the shared pool plus what its lenders may "
    "lend it) and each lender's lendingLimit (what its rules, summed, let anyone "
    "borrow; 0 when it lends to no team), so Kueue never lends more than tideflow's "
    "ledger would; which lender a borrower takes from is Kueue's choice, and a "
    "lender reclaims from any member over its nominal quota",
    thresholds="Kueue has no priority floor for borrowing; every workload of a "
    "ClusterQueue may borrow within its borrowingLimit. tideflow's ledger keeps the "
    "floor for gangs it places itself",
    grace="Kueue evicts a preempted workload at once; its pods get their "
    "terminationGracePeriodSeconds (TIDEFLOW_K8S_GRACE_S, one value for every gang) to "
    "checkpoint and exit",
    timeouts="Kueue returns borrowed quota only to the ClusterQueue that reclaims it, "
    "never after a time. tideflow's ledger applies the timeout to gangs it "
    "places itself; on Kueue a borrowing gang keeps its devices until it ends "
    "or is reclaimed",
)


def _warnings(plan: TeamQueuePlan) -> list[str]:
    """What Kueue's objects cannot express of the cluster file, said once each."""
    found = borrowing_warnings(plan.spec.borrowing, BORROWING)
    found += _class_warnings(plan)
    found += _scheduling_warnings(plan)
    for flavor in plan.broker_flavors:
        if plan.spec.borrowing:
            found.append(
                f"the broker's pool ({flavor.label}, ClusterQueue {TRAINING_QUEUE}): the teams "
                "borrow it from the training queue, not from each other, so borrowing rules "
                "and lending limits bound nothing there; each team may use its nominal plus "
                "its borrowing_limit of whatever the broker lends"
            )
    if not plan.flavor("cpu").memory:
        found.append(
            "memory: the nodes declare none, so flavor cpu covers cpu only and Kueue admits "
            "no gang that requests memory; declare each node group's memory"
        )
    return found


def _class_warnings(plan: TeamQueuePlan) -> list[str]:
    spec = plan.spec
    found: list[str] = []
    mixed = [t.name for t in spec.teams if _preempting(plan, t.name) == (True, False)]
    if mixed:
        found.append(
            f"preempts per priority class (teams {', '.join(mixed)}): Kueue's "
            "withinClusterQueue and borrowWithinCohort (LowerPriority) apply to every class "
            "of a ClusterQueue, so there a higher class without 'preempts' also preempts a "
            "lower one of the same team and lower-priority borrowers. They are set so that "
            "the preempting classes work; give classes that must not preempt each other one "
            "value"
        )
    limited = [t.name for t in spec.teams if t.priority_classes is not None]
    defaults = [t.name for t in spec.teams if t.default_priority_class is not None]
    if limited or defaults:
        found.append(
            "priority classes per team (allowed: "
            f"{', '.join(limited) or 'none'}; default: {', '.join(defaults) or 'none'}): a "
            "WorkloadPriorityClass is cluster-wide and a workload names it with the label "
            "kueue.x-k8s.io/priority-class; Kueue neither restricts which classes a "
            "LocalQueue's workloads use nor defaults one per queue. tideflow's gang step "
            "refuses a class the team may not use and labels its JobSet with the run's class "
            "or the team's default; a workload submitted otherwise is not checked"
        )
    return found


def _scheduling_warnings(plan: TeamQueuePlan) -> list[str]:
    spec = plan.spec
    found: list[str] = []
    reserve = spec.scheduling.reserve_after
    if reserve:
        found.append(
            f"reserve_after ({reserve}s): Kueue has no waiting time after which a workload "
            "reserves quota; StrictFIFO would block at once. BestEffortFIFO is used (a "
            "smaller workload may start ahead of a waiting larger one); tideflow's ledger "
            "reserves for gangs it places itself"
        )
    if spec.scheduling.fair_sharing:
        found.append(
            "fair_sharing: Kueue's fair sharing is switched on in its Configuration "
            "(fairSharing.enable), not by these objects; with it on, Kueue orders borrowers "
            "by their share of the cohort's lendable quota and ignores borrowWithinCohort. "
            "Without it, borrowing workloads go by priority, then creation time"
        )
    budgets = budget_warning(spec, "Kueue")
    return [*found, budgets] if budgets else found


def compile_kueue(
    spec: ClusterSpec, *, namespace: str = NAMESPACE, source: str = "CLUSTER_FILE"
) -> tuple[str, list[str]]:
    """The YAML stream (warnings as comments on top) and the warnings."""
    objects, warnings = kueue_objects(spec, namespace=namespace)
    header = comment_block(
        f"Kueue queues for cluster {spec.metadata.name}, compiled by `tideflow compile "
        f"--target kueue {source}`. One ClusterQueue and one LocalQueue per "
        "team; a gang's JobSet names its team's LocalQueue (kueue.x-k8s.io/queue-name).",
        warnings,
        BROKER_NOTE if plan_team_queues(spec).broker_flavors else "",
    )
    return render(header, objects), warnings
