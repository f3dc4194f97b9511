"""The priority a pipeline's gangs run at, in words, as ``tideflow plan`` shows it.

The rule is the scheduler's (``Teams.priority``, which ``resolve_gang``
applies when a gang asks for devices): the class the run names (the
``priority_class`` param, defaulting to ``metadata.priority_class``), else the
team's ``default_priority_class``; without either, the step's own ``priority``.
"""

from __future__ import annotations

from tideflow.compile.dag_plan import DagPlan
from tideflow.compile.gang_plan import GangStepPlan
from tideflow.inventory import Inventory
from tideflow.scheduling.quota import Teams
from tideflow.spec.params import PRIORITY_PARAM


def gang_priority(plan: DagPlan, gang: GangStepPlan, inventory: Inventory | None) -> str:
    """The gang step ``gang``'s priority at the run's defaults: ``class high
    (params.priority_class), value 500``, ``class batch (team vision's default),
    value 0``, or the step's own ``priority`` when no class applies.

    Without a cluster file the class's value, and a team default, are unknown.
    """
    team, named, step_priority = plan.team, plan.priority_class, gang.priority
    teams = Teams.of(inventory) if inventory is not None else None
    if teams is None:
        if named is not None:
            return f"class {named} (params.{PRIORITY_PARAM})"
        if inventory is None:
            return (
                f"{step_priority} (the step's own, unless the cluster file gives team "
                f"{team} a default class)"
            )
        return f"{step_priority} (the step's own; the cluster file has no priority classes)"
    try:
        value, name = teams.priority(team, named)
    except ValueError as exc:  # validation with the cluster file refuses this already
        return f"class {named}: {exc}"
    if name is None:
        return f"{step_priority} (the step's own; team {team} has no default class)"
    where = f"params.{PRIORITY_PARAM}" if named is not None else f"team {team}'s default"
    return f"class {name} ({where}), value {value}"
