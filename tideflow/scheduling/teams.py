"""A cluster file's teams as the scheduler sees them, and what each holds now.

``Teams`` answers lookups on the teams of ``tideflow.spec.teams`` (the quota
entry a gang counts against, a team's nominal quota, the shared pool, a gang's
priority, a borrowing rule's grace); ``Held`` is a lease as the quota policy
reads it. Admission (``quota``), preemption (``preemption``), reclaim
(``reclaim``) and reservations (``reservation``) all decide on these two, so
they live below all of them. ``team_view`` is the page's view of them: what
each team does with its quota now.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from tideflow.scheduling.model import DeviceClass, GangRequest
from tideflow.spec.teams import device_label

if TYPE_CHECKING:
    from tideflow.inventory import ClusterSpec, Inventory
    from tideflow.scheduling.model import Lease
    from tideflow.spec.teams import BorrowingRule, Quota

SHARED_POOL = ""  # the lender of devices no team's nominal quota covers
DEFAULT_PREEMPTION_GRACE_S = 300.0

Key = tuple[str, str | None]  # (device class, model or None)


@dataclass(frozen=True)
class Held:
    """A lease as the quota policy sees it."""

    gang_id: str
    team: str
    device_class: str
    model: str | None  # the request's model (None: any)
    devices: int
    priority: int
    preemptible: bool
    acquired_at: float
    borrowed: int = 0  # devices beyond the team's nominal quota when it started
    lender: str | None = None  # SHARED_POOL or a team; None when nothing is borrowed
    work_at_risk_s: float = 0.0  # since its last checkpoint (or its start)
    evicting: bool = False  # already asked to stop


class Teams:
    """The scheduler's view of a cluster file's teams (``tideflow.spec.teams``)."""

    def __init__(self, spec: ClusterSpec, inventory: Inventory) -> None:
        self.inventory = inventory
        self.classes = {c.name: c for c in spec.priority_classes}
        self.teams = {t.name: t for t in spec.teams}
        self.rules: dict[tuple[str, str], BorrowingRule] = {
            (r.lender, r.borrower): r for r in spec.borrowing
        }
        self.reserve_after_s = spec.scheduling.reserve_after
        self.fair_sharing = spec.scheduling.fair_sharing
        self.preemption_grace_s = DEFAULT_PREEMPTION_GRACE_S
        self._quotas: dict[tuple[str, Key], Quota] = {
            (t.name, q.key()): q for t in spec.teams for q in t.quota
        }

    @classmethod
    def of(cls, inventory: Inventory) -> Teams | None:
        return None if inventory.teams is None else cls(inventory.teams, inventory)

    # -- lookups ------------------------------------------------------------------------
    def governs(self, team: str) -> bool:
        return team in self.teams

    def key(self, team: str, device_class: str, model: str | None) -> Key:
        """The quota entry a gang counts against: its model's, else its device class's."""
        if model is not None and (team, (device_class, model)) in self._quotas:
            return (device_class, model)
        return (device_class, None)

    def quota(self, team: str, key: Key) -> Quota | None:
        return self._quotas.get((team, key))

    def nominal(self, team: str, key: Key) -> int:
        quota = self.quota(team, key)
        return 0 if quota is None else int(quota.nominal)

    def shared_pool(self, key: Key) -> int:
        """Devices of ``key`` that no team's nominal quota covers."""
        device_class, model = key
        total = sum(n.offers(cast(DeviceClass, device_class), model) for n in self.inventory.nodes)
        # A class-wide quota and the per-model ones draw on the same devices: count every
        # quota that could hold these (the smaller pool is the safe side).
        owned = sum(
            int(q.nominal)
            for (_, (cls, quota_model)), q in self._quotas.items()
            if cls == device_class and (model is None or quota_model in (None, model))
        )
        return max(0, total - owned)

    def priority(self, team: str, class_name: str | None) -> tuple[int, str | None]:
        """A gang's priority from its class (the team's default when none is named).

        ``ValueError`` names what the team may use when the class is unknown or not
        allowed; without a class at all the priority is 0 and no class applies.
        """
        declared = self.teams.get(team)
        name = class_name or (declared.default_priority_class if declared else None)
        if name is None:
            return 0, None
        if name not in self.classes:
            known = ", ".join(sorted(self.classes)) or "none declared"
            raise ValueError(f"unknown priority class '{name}'; declared: {known}")
        allowed = declared.priority_classes if declared else None
        if allowed is not None and name not in allowed:
            raise ValueError(
                f"team '{team}' may not use priority class '{name}'; it may use "
                f"{', '.join(allowed) or 'none'}"
            )
        return self.classes[name].value, name

    def preempts(self, request: GangRequest) -> bool:
        chosen = self.classes.get(request.priority_class or "")
        return chosen is not None and chosen.preempts

    def grace_s(self, victim: Held) -> float:
        rule = self.rules.get((victim.lender or "", victim.team))
        return float(rule.grace) if rule is not None else self.preemption_grace_s


def usage(teams: Teams, held: Sequence[Held], key: Key) -> tuple[dict[str, int], dict[str, int]]:
    """Devices each team uses on ``key``, and devices each lender has lent on it."""
    used: dict[str, int] = {}
    lent: dict[str, int] = {}
    for lease in held:
        if teams.key(lease.team, lease.device_class, lease.model) != key:
            continue
        used[lease.team] = used.get(lease.team, 0) + lease.devices
        if lease.lender is not None and lease.borrowed:
            lent[lease.lender] = lent.get(lease.lender, 0) + lease.borrowed
    return used, lent


def least(request: GangRequest) -> int:
    """The fewest devices the gang can start with (its minimum, for an elastic one)."""
    return (request.min_workers or request.workers) * request.devices_per_worker


# -- the teams now (the page) -------------------------------------------------------------
@dataclass(frozen=True)
class TeamQuotaRow:
    """A team's share of one device class (and model) and what it does with it now."""

    team: str
    device_class: str
    model: str | None  # None: the class-wide quota entry
    nominal: int  # its quota (0: no entry, all it uses is borrowed)
    in_use: int  # devices its leases hold on this entry now
    borrowed: int  # of in_use, beyond nominal (from the shared pool or a lender)
    lent: int  # of nominal, held now by other teams' gangs that borrow it

    @property
    def label(self) -> str:
        return device_label(self.device_class, self.model)


def team_view(teams: Teams, leases: Sequence[Lease]) -> list[TeamQuotaRow]:
    """Per declared team and quota entry: nominal, in use, borrowed and lent now.

    A lease counts against the entry ``Teams.key`` gives it (its model's, else its
    class's), the same entry admission charged it to; a lender's lent devices are
    counted on that entry too. A team that uses a class it has no entry for gets a
    row with nominal 0. Teams outside quotas (the broker's) have no rows.
    """
    rows: dict[tuple[str, str, str | None], list[int]] = {}
    for name, team in teams.teams.items():
        for quota in team.quota:
            rows[(name, str(quota.device), quota.model)] = [int(quota.nominal), 0, 0, 0]
    for lease in leases:
        if not teams.governs(lease.team):
            continue
        device_class, model = teams.key(lease.team, lease.device_class, lease.model)
        row = rows.setdefault((lease.team, device_class, model), [0, 0, 0, 0])
        row[1] += lease.devices
        row[2] += lease.borrowed
        if lease.borrowed and lease.lender and teams.governs(lease.lender):
            lender = rows.setdefault(
                (lease.lender, device_class, model),
                [teams.nominal(lease.lender, (device_class, model)), 0, 0, 0],
            )
            lender[3] += lease.borrowed
    return [
        TeamQuotaRow(team, device_class, model, *numbers)
        for (team, device_class, model), numbers in sorted(
            rows.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or "")
        )
    ]
