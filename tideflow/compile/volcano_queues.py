"""A cluster file's teams as Volcano objects (``tideflow compile --target volcano``).

What maps, read from Volcano's sources (volcano-sh/volcano: the Queue CRD,
docs/design/hierarchical-queue-on-capacity-plugin.md, and the queue webhook
pkg/webhooks/admission/queues/validate/validate_queue.go):

* a team -> a Queue (the gang step's ``queue`` is its team) with the capacity
  plugin's resources per resource name (``nvidia.com/gpu``, ``huawei.com/Ascend910``,
  ``cpu``): ``deserved`` its nominal quota, ``capability`` its nominal plus what
  it may borrow (left out when that is the whole cluster), ``guarantee`` the part
  of its nominal it never lends (nominal less its lending limit);
  ``reclaimable: true``, so what a team borrows goes back when the lender needs it;
* a priority class -> a PriorityClass (scheduling.k8s.io/v1) of the same name
  (``priority_class_name``) that Volcano's preempt action reads from the pods:
  ``preemptionPolicy: Never`` unless it ``preempts``. A gang of that class names it
  in its Job's ``priorityClassName`` (``tideflow.kube.volcano``), which Volcano
  gives its pods;
* the broker's pool -> the parent Queue ``training`` over every team queue: its
  ``deserved`` (and ``guarantee``) the teams' summed, which the queue webhook
  requires of a parent, and its ``capability`` on the pool's resource the GPUs the
  broker lends, never below ``deserved`` (``tideflow.broker.kubernetes``). A team's
  capability on that resource stays within the parent's ``deserved``, so the
  broker's lowest capability is always admitted. Without a broker pool the team
  queues sit under Volcano's ``root``.
"""

from __future__ import annotations

from typing import Any

from tideflow.compile.cluster_names import BROKER_POOL, TRAINING_QUEUE
from tideflow.compile.engine_warnings import BorrowingWords, borrowing_warnings, budget_warning
from tideflow.compile.team_queues import (
    BROKER_NOTE,
    QueueCompileError,
    TeamQueuePlan,
    comment_block,
    plan_team_queues,
    priority_class_name,
    render,
)
from tideflow.inventory import ClusterSpec
from tideflow.spec.teams import PriorityClass

API = "scheduling.volcano.sh/v1beta1"


def _team_resources(plan: TeamQueuePlan, team: str) -> dict[str, dict[str, int | None]]:
    """resource -> {deserved, capability (None: no bound), guarantee}, models summed."""
    found: dict[str, dict[str, int | None]] = {}
    for flavor in plan.flavors:
        share = plan.shares[team].get(flavor.name)
        entry = found.setdefault(flavor.resource, {"deserved": 0, "capability": 0, "guarantee": 0})
        if share is None:  # it may not use this model at all
            continue
        entry["deserved"] = int(entry["deserved"] or 0) + share.nominal
        if entry["capability"] is not None:
            entry["capability"] = (
                None
                if share.borrowing_limit is None
                else int(entry["capability"]) + share.nominal + share.borrowing_limit
            )
        if not flavor.broker and share.lending_limit is not None:
            # The broker may hand any of its pool to inference: none of it can be reserved.
            entry["guarantee"] = int(entry["guarantee"] or 0) + share.nominal - share.lending_limit
    return found


def _totals(plan: TeamQueuePlan) -> dict[str, int]:
    totals: dict[str, int] = {}
    for flavor in plan.flavors:
        totals[flavor.resource] = totals.get(flavor.resource, 0) + flavor.devices
    return totals


def volcano_objects(spec: ClusterSpec) -> tuple[list[dict[str, Any]], list[str]]:
    """The Volcano objects for a cluster file's teams, and the rules they cannot express."""
    plan = plan_team_queues(spec)
    reserved = {"root"} | ({TRAINING_QUEUE} if plan.broker_flavors else set())
    clash = sorted(reserved & set(plan.teams))
    if clash:
        raise QueueCompileError(
            f"team '{clash[0]}' has the name of a queue Volcano or the broker keeps for itself "
            f"({', '.join(sorted(reserved))}): rename the team"
        )
    warnings = list(plan.notes) + _warnings(plan)
    totals = _totals(plan)
    objects = [_priority_class(c) for c in plan.spec.priority_classes]
    teams = {t: _team_resources(plan, t) for t in plan.teams}
    if plan.broker_flavors:
        warnings += _hold_to_training_queue(plan, teams, totals)
    queues = [_team_queue(plan, team, teams[team], totals) for team in plan.teams]
    if plan.broker_flavors:
        objects.append(_parent_queue(plan, queues, totals))
    return objects + queues, warnings


def _priority_class(declared: PriorityClass) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": priority_class_name(declared.name)},
        "value": declared.value,
        "preemptionPolicy": "PreemptLowerPriority" if declared.preempts else "Never",
        "description": declared.description or f"tideflow priority class {declared.name}",
    }


_Resources = dict[str, dict[str, int | None]]


def _hold_to_training_queue(
    plan: TeamQueuePlan, teams: dict[str, _Resources], totals: dict[str, int]
) -> list[str]:
    """Each team's capability on the pool's resources held within the training queue's
    deserved (validate_queue.go validateChildAgainstAncestor: a child's capability
    within its ancestor's, which the broker may lower to the deserved)."""
    held: list[str] = []
    deserved_sum = {r: sum(int(teams[t][r]["deserved"] or 0) for t in plan.teams) for r in totals}
    for t in plan.teams:
        for r in {f.resource for f in plan.broker_flavors}:
            cap = teams[t][r]["capability"]
            if cap is not None and cap > deserved_sum[r]:
                teams[t][r]["capability"] = deserved_sum[r]
                held.append(
                    f"team {t}: its {r} capability {cap} is held to the training queue's "
                    f"deserved {deserved_sum[r]}, the lowest capability the broker sets"
                )
    return held


def _team_queue(
    plan: TeamQueuePlan, team: str, resources: _Resources, totals: dict[str, int]
) -> dict[str, Any]:
    deserved, capability, guarantee = {}, {}, {}
    for resource, entry in resources.items():
        if entry["deserved"]:
            deserved[resource] = str(entry["deserved"])
        cap = entry["capability"]
        if cap is not None and cap < totals[resource]:
            capability[resource] = str(cap)
        if entry["guarantee"]:
            guarantee[resource] = str(entry["guarantee"])
    queue_spec: dict[str, Any] = {"reclaimable": True}
    if plan.broker_flavors:
        queue_spec["parent"] = TRAINING_QUEUE
    if deserved:
        queue_spec["deserved"] = deserved
    if capability:
        queue_spec["capability"] = capability
    if guarantee:
        queue_spec["guarantee"] = {"resource": guarantee}
    return {"apiVersion": API, "kind": "Queue", "metadata": {"name": team}, "spec": queue_spec}


def _parent_queue(
    plan: TeamQueuePlan, queues: list[dict[str, Any]], totals: dict[str, int]
) -> dict[str, Any]:
    """The queue the broker moves: the teams' deserved and guarantee summed (what
    validate_queue.go validateChildrenConstraints requires of a parent), and on the pool's
    resource a capability of the GPUs lent, never below that deserved."""

    def summed(which: str) -> dict[str, str]:
        found = {}
        for resource in sorted(totals):
            total = 0
            for queue in queues:
                held = queue["spec"].get(which, {})
                held = held.get("resource", {}) if which == "guarantee" else held
                total += int(held.get(resource, 0))
            if total:
                found[resource] = str(total)
        return found

    parent: dict[str, Any] = {"reclaimable": True}
    deserved = summed("deserved")
    if deserved:
        parent["deserved"] = deserved
    resources = sorted({f.resource for f in plan.broker_flavors})
    parent["capability"] = {
        r: str(
            max(
                sum(f.devices for f in plan.broker_flavors if f.resource == r),
                int(deserved.get(r, 0)),
            )
        )
        for r in resources
    }
    guarantee = summed("guarantee")
    if guarantee:
        parent["guarantee"] = {"resource": guarantee}
    return {
        "apiVersion": API,
        "kind": "Queue",
        "metadata": {"name": TRAINING_QUEUE},
        "spec": parent,
    }


# What Volcano makes of the borrowing rules (tideflow.compile.engine_warnings).
BORROWING = BorrowingWords(
    ratios="Volcano's capacity plugin lets any queue use any other's idle deserved, up to "
    "its capability. Folded into each borrower's capability (nominal plus the shared "
    "pool plus what its lenders may lend it) and each lender's guarantee (the part "
    "its rules let no one borrow), so Volcano never lends more than tideflow's "
    "ledger would; whom a borrower takes from is Volcano's choice",
    thresholds="a Volcano queue has no priority floor for using others' idle resources; "
    "every job of the queue may, within its capability. tideflow's ledger keeps "
    "the floor for gangs it places itself",
    grace="Volcano's reclaim evicts the borrower's pods, which get their "
    "terminationGracePeriodSeconds (TIDEFLOW_K8S_GRACE_S, one value for every gang) to "
    "checkpoint and exit",
    timeouts="Volcano reclaims for queues below their deserved share, never after a "
    "time. tideflow's ledger applies the timeout to gangs it places itself",
)


def _warnings(plan: TeamQueuePlan) -> list[str]:
    """What Volcano's queues cannot express of the cluster file, said once each."""
    spec = plan.spec
    found = borrowing_warnings(spec.borrowing, BORROWING)
    found += _class_warnings(spec)
    found += _model_warnings(plan)
    found += _scheduling_warnings(spec)
    for flavor in plan.broker_flavors:
        if spec.borrowing:
            found.append(
                f"the broker's pool ({flavor.label}, nodes labelled tideflow.io/pool="
                f"{BROKER_POOL}): the broker may hand any of it to inference, so Volcano "
                "reserves none of it (no guarantee) and the borrowing rules bound nothing "
                "there; each team may use its deserved plus its borrowing_limit of it"
            )
    return found


def _class_warnings(spec: ClusterSpec) -> list[str]:
    found: list[str] = []
    if any(c.preempts for c in spec.priority_classes):
        found.append(
            "preempts: the PriorityClasses carry it (preemptionPolicy), and Volcano's preempt "
            "action stops lower-priority jobs of the same queue; a higher-priority job does "
            "not take devices another queue borrows (Volcano reclaims by queue share, not "
            "priority)"
        )
    limited = [t.name for t in spec.teams if t.priority_classes is not None]
    defaults = [t.name for t in spec.teams if t.default_priority_class is not None]
    if limited or defaults:
        found.append(
            "priority classes per team (allowed: "
            f"{', '.join(limited) or 'none'}; default: {', '.join(defaults) or 'none'}): a "
            "PriorityClass is cluster-wide and a Volcano queue neither restricts nor "
            "defaults one. tideflow's gang step refuses a class the team may not use and "
            "sets its Job's priorityClassName to the run's class or the team's default; a "
            "job submitted otherwise is not checked"
        )
    return found


def _model_warnings(plan: TeamQueuePlan) -> list[str]:
    """Quotas per model summed into one resource name, and models outside the pool."""
    found: list[str] = []
    held: dict[str, list[str]] = {}  # resource -> models the teams hold quota of
    for flavor in plan.flavors:
        shares = [plan.shares[t].get(flavor.name) for t in plan.teams]
        if flavor.model and any(share is not None and share.nominal for share in shares):
            held.setdefault(flavor.resource, []).append(flavor.model)
    for resource, models in sorted(held.items()):
        if len(models) > 1:
            found.append(
                f"quotas per device model ({', '.join(models)}): a Volcano queue's resources "
                f"are resource names, so the teams' quotas of every model are summed into "
                f"{resource}; which model a gang gets is its node selector's, not the queue's"
            )
        pool = {f.model for f in plan.broker_flavors if f.resource == resource}
        if pool and set(models) - pool:
            found.append(
                f"{resource} quotas outside the broker's pool: the broker sets the training "
                "queue's capability to the GPUs of its pool it lends (never below deserved), "
                "so the other models' quotas count in its deserved but not in what it lends"
            )
    return found


def _scheduling_warnings(spec: ClusterSpec) -> list[str]:
    found: list[str] = []
    if any(q.device == "cpu" and q.nominal for t in spec.teams for q in t.quota):
        found.append(
            "cpu quotas: a Volcano queue counts every pod's CPU requests, a GPU or NPU "
            "gang's too; tideflow's cpu quota counts CPU gangs only (GPU gangs that "
            "request cpu use their team's cpu deserved on Volcano)"
        )
    reserve = spec.scheduling.reserve_after
    if reserve is not None:
        found.append(
            f"reserve_after ({reserve}s): a Volcano queue has no waiting time after which a "
            "job reserves resources; tideflow's ledger reserves for gangs it places itself"
        )
    if not spec.scheduling.fair_sharing:
        found.append(
            "fair_sharing: false: Volcano's capacity plugin always orders queues by their "
            "share of deserved (allocated / deserved), which is tideflow's fair sharing"
        )
    budgets = budget_warning(spec, "Volcano")
    return [*found, budgets] if budgets else found


def compile_volcano(spec: ClusterSpec, *, source: str = "CLUSTER_FILE") -> tuple[str, list[str]]:
    """The YAML stream (warnings as comments on top) and the warnings."""
    objects, warnings = volcano_objects(spec)
    header = comment_block(
        f"Volcano queues for cluster {spec.metadata.name}, compiled by `tideflow compile "
        f"--target volcano {source}`. Needs the capacity plugin"
        + (" with enableHierarchy: true." if plan_has_broker(spec) else ".")
        + " One Queue per team: a gang's Volcano Job names its team's queue.",
        warnings,
        BROKER_NOTE if plan_has_broker(spec) else "",
    )
    return render(header, objects), warnings


def plan_has_broker(spec: ClusterSpec) -> bool:
    return bool(plan_team_queues(spec).broker_flavors)
