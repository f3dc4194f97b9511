"""Teams in the cluster file: quotas, borrowing rules and priority classes.

A cluster file (``kind: Cluster``) may declare, besides its nodes, who owns
which share of them::

    priority_classes:
      - {name: urgent, value: 1000, preempts: true}
      - {name: normal, value: 100}
      - {name: batch, value: 0}
    teams:
      - name: risk
        quota: [{device: gpu, nominal: 40, borrowing_limit: 40}]
        default_priority_class: normal
      - name: marketing
        quota: [{device: gpu, nominal: 30, lending_limit: 24}]
    borrowing:
      - {lender: marketing, borrower: risk, max_borrowable_ratio: 0.8,
         min_priority_class: normal, grace: 10m, auto_return_timeout: 8h}

The models here check each field; ``team_issues`` checks what spans fields
(names that must exist, quotas against the nodes, cycles in lending) and
reports each at its line. The scheduler's view of the same declaration is
``tideflow.scheduling.quota.Teams``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any, Literal

from pydantic import Field

from tideflow.spec.base import SpecModel
from tideflow.spec.errors import SpecIssue
from tideflow.spec.fields import DurationSeconds, Name, StrictNumber, strict_int
from tideflow.spec.yamlpos import Path, Positions, format_path

# The ledger's priorities run from the spare GPU lease (-100) up to the broker's
# inference reservations (1,000,000); a class stays well inside that range.
PRIORITY_RANGE = (-1000, 100_000)


def device_label(device_class: str, model: str | None) -> str:
    """How a quota's devices are named to people: ``gpu``, or ``H100 gpu``."""
    return device_class if model is None else f"{model} {device_class}"


class PriorityClass(SpecModel):
    name: Name
    value: strict_int(ge=PRIORITY_RANGE[0], le=PRIORITY_RANGE[1]) = Field(  # type: ignore[valid-type]
        description="Higher goes first; also the Kueue WorkloadPriorityClass value."
    )
    preempts: bool = Field(
        default=False,
        description="A gang of this class that fits its team's quota may stop "
        "lower-priority gangs of its own team, and lower-priority gangs that borrow, "
        "after they checkpoint. It never stops another team's gang that runs within "
        "that team's own quota.",
    )
    description: str = ""


class Quota(SpecModel):
    """A team's share of one device class (and model, when named)."""

    device: Literal["cpu", "gpu", "npu"]
    model: str | None = Field(
        default=None,
        description="Only gangs that name this model count against it; without one, "
        "the class-wide quota that gangs naming no model (or a model the team has no "
        "quota entry for) count against.",
    )
    nominal: strict_int(ge=0)  # type: ignore[valid-type]
    borrowing_limit: strict_int(ge=0) | None = Field(  # type: ignore[valid-type]
        default=None, description="Most devices the team may use beyond nominal; null: no limit."
    )
    lending_limit: strict_int(ge=0) | None = Field(  # type: ignore[valid-type]
        default=None,
        description="Most of its nominal the team lends while idle; null: all of it.",
    )
    budget_device_hours: StrictNumber | None = Field(
        default=None,
        description="Device-hours per calendar month the team plans to use (shown "
        "against its use; not enforced).",
    )

    def key(self) -> tuple[str, str | None]:
        return (self.device, self.model)

    def label(self) -> str:
        return device_label(self.device, self.model)


class Team(SpecModel):
    name: Name
    quota: tuple[Quota, ...] = ()
    priority_classes: tuple[Name, ...] | None = Field(
        default=None,
        description="The classes this team's pipelines may use (the DAG's params may "
        "choose among them); null: every class.",
    )
    default_priority_class: Name | None = None


class BorrowingRule(SpecModel):
    """What ``borrower`` may use of ``lender``'s idle quota, and how it is given back."""

    lender: Name
    borrower: Name
    max_borrowable_ratio: StrictNumber = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="Most of the lender's nominal quota the borrower may hold at once.",
    )
    min_priority_class: Name | None = Field(
        default=None,
        description="Only the borrower's gangs of this class or higher may borrow.",
    )
    grace: DurationSeconds = Field(
        default=300,
        description="When the lender needs its quota back, how long a borrowing gang "
        "has to checkpoint and stop before it is stopped anyway.",
    )
    auto_return_timeout: DurationSeconds | None = Field(
        default=None,
        description="After this long, a borrowing gang gives its devices back to any "
        "other team's waiting gang, not only the lender's; null: only to the lender.",
    )


class Scheduling(SpecModel):
    reserve_after: DurationSeconds | None = Field(
        default=1800,
        description="A gang that has waited this long, and that its quota admits, holds "
        "the nodes where it can start soonest and its quota: gangs of its priority or "
        "lower queued after it start on other nodes, so smaller gangs cannot starve it "
        "of room. A gang still waiting for its team's quota reserves nothing. null: "
        "never reserve.",
    )
    fair_sharing: bool = Field(
        default=True,
        description="Among gangs of one priority that must borrow, the team that uses "
        "the smallest share of its nominal quota goes first.",
    )


# -- checks that span fields ------------------------------------------------------------
Devices = Callable[[str, str | None], int]  # (device class, model or None) -> devices declared


def team_issues(data: Any, file: str, positions: Positions, devices: Devices) -> list[SpecIssue]:
    """Cross-field problems of a cluster file's teams, each at its line."""
    if not isinstance(data, dict):
        return []
    issues: list[SpecIssue] = []

    def add(path: Path, problem: str, accepted: str) -> None:
        line, col = positions.of_value(path)
        issues.append(SpecIssue(file, line, col, format_path(path), problem, accepted))

    classes = _names(data.get("priority_classes"), "priority_classes", add)
    teams = _names(data.get("teams"), "teams", add)
    if data.get("borrowing") and not teams:
        add(("borrowing",), "borrowing rules without teams", "declare the teams first")
    sums: _QuotaSums = defaultdict(list)
    for t, team in _dicts(data.get("teams")):
        _team_class_issues(team, t, classes, add)
        _team_quota_issues(team, t, sums, add)
    _quota_sum_issues(sums, devices, add)
    _borrowing_issues(data.get("borrowing"), teams, classes, add)
    return issues


Add = Callable[[Path, str, str], None]
# Nominal quotas by (device class, model or None), with where each is written.
_QuotaSums = defaultdict[tuple[str, str | None], list[tuple[Path, int]]]


def _one_of(names: set[str]) -> str:
    return f"one of {', '.join(sorted(names)) or 'none declared'}"


def _team_class_issues(team: dict[str, Any], t: int, classes: set[str], add: Add) -> None:
    """A team's priority classes are declared ones, its default among them."""
    allowed = team.get("priority_classes")
    names = allowed if isinstance(allowed, list) else []
    for c, name in enumerate(names):
        if isinstance(name, str) and name not in classes:
            add(
                ("teams", t, "priority_classes", c),
                f"unknown priority class '{name}'",
                _one_of(classes),
            )
    default = team.get("default_priority_class")
    if not isinstance(default, str):
        return
    if default not in classes:
        add(
            ("teams", t, "default_priority_class"),
            f"unknown priority class '{default}'",
            _one_of(classes),
        )
    elif isinstance(allowed, list) and default not in allowed:
        add(
            ("teams", t, "default_priority_class"),
            f"'{default}' is not among the team's priority_classes",
            f"one of {', '.join(map(str, allowed))}",
        )


def _team_quota_issues(team: dict[str, Any], t: int, sums: _QuotaSums, add: Add) -> None:
    """One quota per device and model, lending only what is the team's; nominal quotas
    are gathered into ``sums`` for the check against the nodes."""
    seen: set[tuple[Any, Any]] = set()
    for q, quota in _dicts(team.get("quota")):
        key = (quota.get("device"), quota.get("model"))
        path: Path = ("teams", t, "quota", q)
        if key in seen:
            add(path, f"a second quota for {_label(key)}", "one quota per device and model")
        seen.add(key)
        nominal = quota.get("nominal")
        lending = quota.get("lending_limit")
        if isinstance(nominal, int) and isinstance(lending, int) and lending > nominal:
            add(
                (*path, "lending_limit"),
                f"lending_limit {lending} is above nominal {nominal}",
                f"at most {nominal}: a team lends only its own quota",
            )
        if isinstance(key[0], str) and isinstance(nominal, int) and _is_int(nominal):
            sums[(key[0], key[1] if isinstance(key[1], str) else None)].append(
                ((*path, "nominal"), nominal)
            )


def _quota_sum_issues(sums: _QuotaSums, devices: Devices, add: Add) -> None:
    """Nominal quotas fit the nodes, per model, and per device class over every model's
    and the class-wide quotas: a class-wide quota is drawn from the same devices as the
    per-model ones."""
    by_class: _QuotaSums = defaultdict(list)
    for (device, model), entries in sums.items():
        if model is not None:
            by_class[(device, None)].extend(entries)
    for (device, _), entries in list(by_class.items()):
        entries.extend(sums.get((device, None), []))
    checks = {**sums, **{k: v for k, v in by_class.items() if len(v) > len(sums.get(k, []))}}
    for (device, model), entries in sorted(checks.items(), key=lambda kv: str(kv[0])):
        have = devices(device, model)
        total = sum(n for _, n in entries)
        if total <= have:
            continue
        label = _label((device, model))
        for path, _ in entries:
            add(
                path,
                f"the teams' nominal {label} quotas sum to {total}, but the nodes declare {have}",
                f"nominal quotas of {label} summing to at most {have}",
            )


def _borrowing_issues(rules: Any, teams: set[str], classes: set[str], add: Add) -> None:
    """Borrowing names declared teams and classes, and lending runs one way."""
    edges: dict[str, set[str]] = defaultdict(set)
    for r, rule in _dicts(rules):
        lender, borrower = rule.get("lender"), rule.get("borrower")
        for field, name in (("lender", lender), ("borrower", borrower)):
            if isinstance(name, str) and name not in teams:
                add(("borrowing", r, field), f"unknown team '{name}'", _one_of(teams))
        if isinstance(lender, str) and lender == borrower:
            add(
                ("borrowing", r, "borrower"),
                f"team '{lender}' lends to itself",
                "a borrower other than the lender",
            )
        elif isinstance(lender, str) and isinstance(borrower, str):
            edges[lender].add(borrower)
        threshold = rule.get("min_priority_class")
        if isinstance(threshold, str) and threshold not in classes:
            add(
                ("borrowing", r, "min_priority_class"),
                f"unknown priority class '{threshold}'",
                _one_of(classes),
            )
    for r, rule in _dicts(rules):
        lender, borrower = rule.get("lender"), rule.get("borrower")
        if isinstance(lender, str) and isinstance(borrower, str) and lender != borrower:
            cycle = _path(edges, borrower, lender)
            if cycle:
                add(
                    ("borrowing", r),
                    "lending forms a cycle: " + " -> ".join([lender, *cycle]),
                    "lending that runs one way: in a cycle two teams "
                    "reclaim from each other in turn, each preemption undoing the last",
                )


def _names(items: Any, section: str, add: Callable[[Path, str, str], None]) -> set[str]:
    names: set[str] = set()
    for i, item in _dicts(items):
        name = item.get("name")
        if isinstance(name, str):
            if name in names:
                add((section, i, "name"), f"'{name}' is declared twice", "unique names")
            names.add(name)
    return names


def _dicts(items: Any) -> Iterable[tuple[int, dict[str, Any]]]:
    if not isinstance(items, list):
        return []
    return [(i, item) for i, item in enumerate(items) if isinstance(item, dict)]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _label(key: tuple[Any, Any]) -> str:
    device, model = key
    return device_label(str(device), None if model is None else str(model))


def _path(edges: dict[str, set[str]], start: str, goal: str) -> list[str]:
    """A lending path from ``start`` to ``goal`` (inclusive), or [] when there is none."""
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, trail = stack.pop()
        if node == goal:
            return trail
        if node in seen:
            continue
        seen.add(node)
        stack.extend((nxt, [*trail, nxt]) for nxt in sorted(edges.get(node, ())))
    return []
