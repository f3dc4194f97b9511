"""What a queue engine cannot hold of the teams' quota rules, said the same way for
Kueue and Volcano: the compilers give the engine's words, this module the rules' facts."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tideflow.inventory import ClusterSpec
from tideflow.spec.teams import BorrowingRule


@dataclass(frozen=True)
class BorrowingWords:
    """An engine's account of tideflow's borrowing rules, one text per warning; each
    follows the list of the rules it is about."""

    ratios: str  # how the engine lends, and how the ratios were folded into its queues
    thresholds: str  # min_priority_class: the engine has no priority floor for borrowing
    grace: str  # how the engine evicts a borrower, and with what grace
    timeouts: str  # auto_return_timeout: when the engine gives borrowed quota back


def borrowing_warnings(rules: Sequence[BorrowingRule], words: BorrowingWords) -> list[str]:
    """One warning per part of the borrowing rules the engine cannot hold as declared."""
    if not rules:
        return []
    pairs = ", ".join(f"{r.lender}->{r.borrower} {r.max_borrowable_ratio:g}" for r in rules)
    found = [
        f"borrowing rules per lender and borrower (max_borrowable_ratio: {pairs}): " + words.ratios
    ]
    thresholds = [r for r in rules if r.min_priority_class is not None]
    if thresholds:
        found.append(
            "min_priority_class ("
            + ", ".join(f"{r.lender}->{r.borrower}: {r.min_priority_class}" for r in thresholds)
            + "): "
            + words.thresholds
        )
    graces = sorted({r.grace for r in rules})
    found.append(
        f"grace per borrowing rule ({', '.join(f'{g}s' for g in graces)}): "
        + words.grace
        + tenant_grace(r.lender for r in rules)
    )
    timeouts = [r for r in rules if r.auto_return_timeout is not None]
    if timeouts:
        found.append(
            "auto_return_timeout ("
            + ", ".join(f"{r.lender}->{r.borrower}: {r.auto_return_timeout}s" for r in timeouts)
            + "): "
            + words.timeouts
        )
    return found


def tenant_grace(lenders: Iterable[str]) -> str:
    """What the grace warning adds when team ``inference`` lends: the broker, its tenant,
    reclaims with each rule's grace (``tideflow.broker.tenant``)."""
    if "inference" not in set(lenders):
        return ""
    return (
        "; the broker, as team inference's tenant (TIDEFLOW_CLUSTER_FILE), evicts what "
        "inference lent with its rule's grace (deleteOptions.gracePeriodSeconds)"
    )


def budget_warning(spec: ClusterSpec, engine: str) -> str | None:
    """Budgets are device-hours, which no engine's quota is: say so, naming them."""
    budgets = [
        f"{t.name} {q.label()} {q.budget_device_hours:g}"
        for t in spec.teams
        for q in t.quota
        if q.budget_device_hours is not None
    ]
    if not budgets:
        return None
    return (
        f"budget_device_hours ({', '.join(budgets)}): no {engine} quota is in device-hours; "
        "tideflow shows use against the budget and enforces nothing, as it does locally"
    )
