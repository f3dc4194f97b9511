"""Device-hours per team, pipeline and DAG run: own quota, borrowed, lost; budgets.

Pure functions of the lease ledger's usage spans (``LeaseLedger.usage_spans``)
and, for the page's view of teams, of the leases held now. Nothing here reads a
clock or a database: the caller chooses the window and passes what it read.

The split of one span's device-hours (devices x time held within the window):

* ``own``: the devices within the team's nominal quota;
* ``borrowed``: the devices beyond it (the shared pool's or a lender's);
* ``lost``: device-hours of work a forced stop threw away (the time since the
  gang's last checkpoint, on each of its devices). Lost hours were held, so
  they are *part of* own + borrowed, not added to them; they count in the
  window in which the gang was stopped.

``own + borrowed`` is always the span's device-hours.

What a lease is grouped under (``group_key``):

* a gang or an evaluation's device lease, ``PIPELINE/RUN/STEP``: its pipeline
  (``--by pipeline``) or ``PIPELINE/RUN``, its DAG run (``--by run``); the
  DAG run is also the MLflow parent run, and ``gang_usage`` gives one gang's
  split for its own MLflow run;
* the broker's inference reservations, ``broker/inference/N``: all of them
  under ``broker/inference`` (they belong to no pipeline or run);
* any other lease (one taken by hand): under its own id.

Every span carries the device model its lease was granted on (unknown for
leases a ledger recorded before it kept the model), so the report has a row
per device class and model.

Budgets (``budget_device_hours`` of a quota entry) are per calendar month in
UTC. A per-model entry's budget counts that model's device-hours only; the
class-wide entry's budget counts the rest of the class: the models without a
budget of their own, and hours of unknown model (``model_budgets``, what
``tideflow usage`` reports). ``budgets`` adds up a team's entries per class
against all its device-hours on the class.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tideflow.scheduling.teams import TeamQuotaRow, team_view

if TYPE_CHECKING:
    from tideflow.inventory import ClusterSpec
    from tideflow.scheduling.usage import UsageSpan

GroupBy = Literal["team", "pipeline", "run"]
GROUPINGS: tuple[GroupBy, ...] = ("team", "pipeline", "run")

# tideflow.broker.local.INFERENCE_PREFIX; the broker sits above scheduling and may not
# be imported from here (tests/teams/test_accounting.py checks the two agree).
BROKER_PREFIX = "broker/inference/"
BROKER_GROUP = "broker/inference"
STOPPED = ("preempted", "forced")  # how a span ends when the ledger asked the gang to stop


# -- grouping ---------------------------------------------------------------------------
def group_key(gang_id: str, by: GroupBy, team: str) -> str:
    """What ``gang_id``'s device-hours count under when grouped ``by``."""
    if by == "team":
        return team
    if gang_id.startswith(BROKER_PREFIX):
        return BROKER_GROUP
    parts = gang_id.split("/", 2)
    if len(parts) < 3 or not all(parts):
        return gang_id  # not a pipeline's lease: kept apart, under its own id
    return parts[0] if by == "pipeline" else f"{parts[0]}/{parts[1]}"


@dataclass(frozen=True)
class Split:
    """Device-hours of one gang or group: own quota + borrowed = total; lost is within."""

    own_hours: float = 0.0
    borrowed_hours: float = 0.0
    lost_hours: float = 0.0

    @property
    def device_hours(self) -> float:
        return self.own_hours + self.borrowed_hours


def span_split(span: UsageSpan) -> Split:
    seconds = max(0.0, span.ended_at - span.started_at)
    borrowed = min(max(0, span.borrowed), span.devices)
    return Split(
        own_hours=(span.devices - borrowed) * seconds / 3600,
        borrowed_hours=borrowed * seconds / 3600,
        lost_hours=span.lost_device_s / 3600,
    )


def _add(a: Split, b: Split) -> Split:
    return Split(
        a.own_hours + b.own_hours,
        a.borrowed_hours + b.borrowed_hours,
        a.lost_hours + b.lost_hours,
    )


def gang_usage(spans: Iterable[UsageSpan], gang_id: str) -> Split:
    """One gang's device-hours over all its leases in ``spans`` (a retried step's gang
    keeps its id, so every attempt counts): what its MLflow run is tagged with."""
    total = Split()
    for span in spans:
        if span.gang_id == gang_id:
            total = _add(total, span_split(span))
    return total


@dataclass(frozen=True)
class UsageTotal:
    """One row of ``tideflow usage``: a group's device-hours on one device class and model."""

    key: str  # the team, the pipeline or PIPELINE/RUN (see group_key)
    team: str
    device_class: str
    device_hours: float
    own_hours: float
    borrowed_hours: float
    lost_hours: float
    preempted: int  # leases the ledger stopped (preempted or forced) within the window
    gangs: int  # distinct gang ids
    model: str = ""  # the device model ("": cpu, or a lease recorded before models were)


def _model(span: UsageSpan) -> str:
    return span.model or ""


def usage_totals(
    spans: Iterable[UsageSpan], by: GroupBy = "team", *, until: float | None = None
) -> list[UsageTotal]:
    """Device-hours per group, team, device class and model, sorted in that order.

    ``until``: the window's end the spans were clipped to. A span clipped there was
    still running then, so a stop after it is not counted as within the window.
    """
    if by not in GROUPINGS:
        raise ValueError(f"unknown grouping {by!r}; one of {', '.join(GROUPINGS)}")
    splits: dict[tuple[str, str, str, str], Split] = {}
    stopped: dict[tuple[str, str, str, str], int] = {}
    gangs: dict[tuple[str, str, str, str], set[str]] = {}
    for span in spans:
        group = group_key(span.gang_id, by, span.team)
        key = (group, span.team, span.device_class, _model(span))
        splits[key] = _add(splits.get(key, Split()), span_split(span))
        gangs.setdefault(key, set()).add(span.gang_id)
        ended_inside = until is None or span.ended_at < until
        if span.ended_by in STOPPED and ended_inside:
            stopped[key] = stopped.get(key, 0) + 1
    return [
        UsageTotal(
            key=key[0],
            team=key[1],
            device_class=key[2],
            device_hours=split.device_hours,
            own_hours=split.own_hours,
            borrowed_hours=split.borrowed_hours,
            lost_hours=split.lost_hours,
            preempted=stopped.get(key, 0),
            gangs=len(gangs[key]),
            model=key[3],
        )
        for key, split in sorted(splits.items())
    ]


# -- windows ----------------------------------------------------------------------------
_AGO = re.compile(r"^(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
WHEN_ACCEPTED = (
    "an ISO date or date-time (2026-11-01, 2026-11-01T08:00; UTC unless it names an "
    "offset such as +02:00) or a duration back from now (90m, 24h, 7d, 2w, 1d12h)"
)


def parse_when(text: str, now: float, flag: str = "--since") -> float:
    """Epoch seconds from an ISO date/date-time or a duration back from ``now``.

    ``ValueError`` names ``flag`` and what it accepts.
    """
    value = text.strip()
    match = _AGO.match(value)
    if value and match and any(match.groups()):
        weeks, days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
        return now - ((((weeks * 7 + days) * 24 + hours) * 60 + minutes) * 60 + seconds)
    try:
        at = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{flag} {text!r} is neither a date nor a duration; accepted: {WHEN_ACCEPTED}"
        ) from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=dt.UTC)  # the ledger's clock and the budget month are UTC
    return at.timestamp()


# -- budgets ----------------------------------------------------------------------------
def month_window(now: float) -> tuple[float, float]:
    """The calendar month (UTC) that ``now`` falls in, as [start, end) epoch seconds."""
    at = dt.datetime.fromtimestamp(now, dt.UTC)
    start = at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else (start.replace(month=start.month + 1))
    )
    return start.timestamp(), end.timestamp()


@dataclass(frozen=True)
class BudgetUse:
    team: str
    device_class: str
    budget_hours: float  # device-hours the team plans per calendar month on the class
    used_hours: float  # its device-hours on the class this month so far
    model: str | None = None  # the quota entry's model (None: class-wide, or all of it)

    @property
    def share(self) -> float | None:
        """Used / budget (1.0 = all of it); None for a budget of 0."""
        return self.used_hours / self.budget_hours if self.budget_hours else None


def budgets(spec: ClusterSpec | None, month_spans: Iterable[UsageSpan]) -> list[BudgetUse]:
    """Each team's monthly budget per device class against its use in ``month_spans``
    (the spans of the current calendar month); teams without a budget are left out."""
    planned: dict[tuple[str, str], float] = {}
    for (team, device_class, _), hours in _planned(spec).items():
        planned[(team, device_class)] = planned.get((team, device_class), 0.0) + hours
    used: dict[tuple[str, str], float] = {}
    for span in month_spans:
        key = (span.team, span.device_class)
        if key in planned:
            used[key] = used.get(key, 0.0) + span.device_hours
    return [
        BudgetUse(team, device_class, hours, used.get((team, device_class), 0.0))
        for (team, device_class), hours in sorted(planned.items())
    ]


def _planned(spec: ClusterSpec | None) -> dict[tuple[str, str, str | None], float]:
    """Each quota entry's monthly budget: (team, device class, model or None) -> hours."""
    if spec is None:
        return {}
    return {
        (team.name, str(quota.device), quota.model): float(quota.budget_device_hours)
        for team in spec.teams
        for quota in team.quota
        if quota.budget_device_hours is not None
    }


def budget_entry(
    planned: Collection[tuple[str, str, str | None]], team: str, device_class: str, model: str
) -> tuple[str, str, str | None]:
    """The budget that hours of ``model`` count against: its model's, where the team
    has one among ``planned``, else its class-wide one (a model "" is unknown)."""
    own = (team, device_class, model or None)
    return own if own in planned else (team, device_class, None)


def model_budgets(spec: ClusterSpec | None, month_spans: Iterable[UsageSpan]) -> list[BudgetUse]:
    """Each team's monthly budget per quota entry (class and model) against the hours in
    ``month_spans`` that count against it (``budget_entry``); entries without a budget
    are left out."""
    planned = _planned(spec)
    used: dict[tuple[str, str, str | None], float] = {}
    for span in month_spans:
        entry = budget_entry(planned, span.team, span.device_class, _model(span))
        if entry in planned:
            used[entry] = used.get(entry, 0.0) + span.device_hours
    return [
        BudgetUse(team, device_class, hours, used.get((team, device_class, model), 0.0), model)
        for (team, device_class, model), hours in sorted(
            planned.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or "")
        )
    ]


# -- the report (tideflow usage) ---------------------------------------------------------
SPLIT_COLUMNS = (
    "device_class",
    "device_hours",
    "own_hours",
    "borrowed_hours",
    "lost_hours",
    "preempted",
    "gangs",
)
BUDGET_COLUMNS = ("budget_device_hours", "month_device_hours", "budget_used")


def report_columns(by: GroupBy) -> tuple[str, ...]:
    """The report's columns: the group, its team, the split; budgets when by team."""
    if by == "team":
        return ("team", *SPLIT_COLUMNS, *BUDGET_COLUMNS, "model")
    return (by, "team", *SPLIT_COLUMNS, "model")


def report_rows(
    totals: Sequence[UsageTotal], by: GroupBy, budget_uses: Sequence[BudgetUse] = ()
) -> list[dict[str, str | int | float | None]]:
    """The report as rows of ``report_columns(by)``. By team, every budget
    (``model_budgets``) is listed, with 0 hours when nothing counted against it in the
    window; a row's budget fields are those of the budget its hours count against
    (``budget_entry``), None where there is none."""
    rows: list[dict[str, str | int | float | None]] = []
    planned = {(b.team, b.device_class, b.model): b for b in budget_uses} if by == "team" else {}
    listed = list(totals)
    if by == "team":
        present = {budget_entry(planned, t.team, t.device_class, t.model) for t in listed}
        listed += [
            UsageTotal(b.team, b.team, b.device_class, 0.0, 0.0, 0.0, 0.0, 0, 0, b.model or "")
            for entry, b in planned.items()
            if entry not in present
        ]
        listed.sort(key=lambda t: (t.key, t.device_class, t.model))
    for total in listed:
        row: dict[str, str | int | float | None] = {by: total.key}
        if by != "team":
            row["team"] = total.team
        row.update(
            device_class=total.device_class,
            device_hours=total.device_hours,
            own_hours=total.own_hours,
            borrowed_hours=total.borrowed_hours,
            lost_hours=total.lost_hours,
            preempted=total.preempted,
            gangs=total.gangs,
        )
        if by == "team":
            budget = planned.get(budget_entry(planned, total.team, total.device_class, total.model))
            row.update(
                budget_device_hours=None if budget is None else budget.budget_hours,
                month_device_hours=None if budget is None else budget.used_hours,
                budget_used=None if budget is None else budget.share,
            )
        row["model"] = total.model
        rows.append(row)
    return rows


__all__ = [
    "BROKER_GROUP",
    "BROKER_PREFIX",
    "BUDGET_COLUMNS",
    "GROUPINGS",
    "SPLIT_COLUMNS",
    "BudgetUse",
    "GroupBy",
    "Split",
    "TeamQuotaRow",
    "UsageTotal",
    "budget_entry",
    "budgets",
    "gang_usage",
    "group_key",
    "model_budgets",
    "month_window",
    "parse_when",
    "report_columns",
    "report_rows",
    "span_split",
    "team_view",
    "usage_totals",
]
