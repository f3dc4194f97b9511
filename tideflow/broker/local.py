"""The local actuator: inference capacity as whole-node reservations in the lease ledger.

Inference holds one lease per node it reserves (gang ids ``broker/inference/N``,
team ``inference``, top priority), so training gangs can only be placed on what
is left, and lending a node back is releasing its lease. Growing inference
preempts the decision's victims through the gang backend (SIGUSR1 to the
supervisor -> SIGTERM to the workers -> checkpoint -> exit 75, resumable),
waits up to the grace for them to stop, takes their devices back from the
ledger, and only then places the new reservations. A victim that has not
stopped by the end of the grace is cancelled (its work since its last
checkpoint is lost) and says so in the result. An elastic gang that is to
shrink is stopped the same way and resumes on the workers left to it
(restart-based elasticity: its operator's next lease is smaller).

When the cluster file declares a team named ``inference``, the broker is a
tenant like any other (``tideflow.scheduling.quota``): its reservations count
against that team's nominal quota, the nodes it lends are that quota's idle
devices, which other teams borrow under the file's borrowing rules, and
growing back is the lender's reclaim. The ledger then chooses whom to stop (the
gangs that borrow inference's quota, cheapest first) and gives each its rule's
grace; the actuator carries the evictions out with ``enforce_evictions``, as a
waiting training gang does. The broker can then never take more than its
quota, nor stop a gang that runs within its own team's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tideflow.backends.protocol import Backend
from tideflow.broker.actuator import Applied
from tideflow.broker.calibrate import TrainingWork
from tideflow.broker.journal import PreemptionCount
from tideflow.broker.policy import BrokerDecision, GangView
from tideflow.broker.tenant import INFERENCE_PRIORITY, capped, ceiling, governs_inference
from tideflow.broker.tenant import INFERENCE_TEAM as INFERENCE_TEAM  # noqa: PLC0414 (tideflow.ui)
from tideflow.checkpoint.recency import work_at_risk_since, work_lost_at
from tideflow.gangs.evictions import enforce_evictions, kill_gang, left_nothing
from tideflow.scheduling import GangRequest, Lease, LeaseLedger

INFERENCE_PREFIX = "broker/inference/"
STOPPED = ("preempted", "forced")  # usage rows of leases ended by a stop (LeaseLedger.release)
RESERVATION_TTL_S = 365 * 86400.0  # held until the broker lends it back


class LocalActuator:
    def __init__(
        self,
        ledger: LeaseLedger,
        backend: Backend | None,
        *,
        node_gpus: int,
        device_class: str = "gpu",
        model: str | None = None,
        grace_s: float = 300.0,
        poll_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        checkpoint_store: Callable[[str], str | None] | None = None,
    ) -> None:
        self.ledger = ledger
        self.backend = backend
        self.node_gpus = node_gpus
        self.device_class = device_class
        self.model = model
        self.grace_s = grace_s
        self.poll_s = poll_s
        self.clock = clock
        self.sleep = sleep
        # gang id -> the URI of its checkpoint store (LocalBackend.checkpoint_store)
        self.checkpoint_store = checkpoint_store
        self._observed: list[Lease] | None = None  # the leases read for an observation

    # -- reading the ledger -------------------------------------------------------------
    @property
    def tenant(self) -> bool:
        """Whether inference is a team of the cluster file (quota, borrowing, reclaim)."""
        return governs_inference(self.ledger.teams)

    def capacity(self) -> int:
        """The most GPUs inference may hold: its team's nominal quota when it is a
        tenant (the broker's dynamic quota moves within it), else the whole class."""
        teams = self.ledger.teams
        if teams is None or not self.tenant:
            return self.total_gpus()
        key = teams.key(INFERENCE_TEAM, self.device_class, self.model)
        return ceiling(teams, key, self.total_gpus())

    def least_gpus(self) -> int:
        """The fewest GPUs inference keeps whatever the decision: none here, since the
        ledger lends only what the borrowing rules allow."""
        return 0

    def _of_class(self) -> list[Lease]:
        leases = self.ledger.leases() if self._observed is None else self._observed
        return [lease for lease in leases if lease.device_class == self.device_class]

    def reservations(self) -> list[Lease]:
        return [x for x in self._of_class() if x.gang_id.startswith(INFERENCE_PREFIX)]

    def inference_gpus(self) -> int:
        return sum(len(p.devices) for x in self.reservations() for p in x.placements)

    def total_gpus(self) -> int:
        return sum(
            n.devices for n in self.ledger.inventory.nodes if n.device_class == self.device_class
        )

    @contextmanager
    def observing(self) -> Iterator[None]:
        """The leases read once for the observation, so that its answers agree with each
        other (a gang may take or free devices between two reads)."""
        self._observed = self.ledger.leases()
        try:
            yield
        finally:
            self._observed = None

    def gangs(self) -> tuple[GangView, ...]:
        """Training (and spare) leases as the policy sees them.

        The work at risk runs from the gang's newest committed checkpoint, read
        from its checkpoint store, or from its lease's start when it has none
        (or the store cannot be read): that overstates it, the safe direction.
        """
        return tuple(
            GangView(
                x.gang_id,
                sum(len(p.devices) for p in x.placements),
                x.priority,
                work_at_risk_since(
                    x.acquired_at,
                    self.checkpoint_store(x.gang_id) if self.checkpoint_store else None,
                ),
                # an elastic gang may give back all but its minimum's devices
                x.min_workers * len(x.placements[0].devices)
                if x.min_workers is not None and x.placements
                else None,
                tuple(p.node for p in x.placements),
            )
            for x in self._of_class()
            if not x.gang_id.startswith(INFERENCE_PREFIX) and x.preemptible
        )

    def empty_nodes(self) -> int | None:
        """Nodes of the class no lease holds: what inference can grow onto at once. None
        (the policy counts GPUs) unless every node of the class is one reservation's
        worth, ``node_gpus`` devices."""
        nodes = [n for n in self.ledger.inventory.nodes if n.device_class == self.device_class]
        if not nodes or any(n.devices != self.node_gpus for n in nodes):
            return None
        used = self.ledger.used_devices(self.device_class)
        return sum(1 for n in nodes if not used.get(n.name))

    def pinned_nodes(self) -> frozenset[str]:
        """Nodes held by a lease the broker may not stop (not preemptible, not its own)."""
        return frozenset(
            p.node
            for x in self._of_class()
            if not x.preemptible and not x.gang_id.startswith(INFERENCE_PREFIX)
            for p in x.placements
        )

    def idle_training_gpus(self) -> int:
        used = sum(len(p.devices) for x in self._of_class() for p in x.placements)
        return self.total_gpus() - used

    def preemption_counts(self) -> tuple[PreemptionCount, ...] | None:
        """None: the ledger's usage record counts every stop already."""
        return None

    def training_work(self, since_s: float, until_s: float) -> TrainingWork:
        """Training's device-time on the class over [since_s, until_s] and the stops in it,
        from the ledger's usage record (``LeaseLedger.usage_spans``).

        Every stop counts, whoever asked for it (the broker, a lender's reclaim, a
        priority preemption): each costs training work, the safe direction for a budget.
        """
        trained = recorded = 0.0
        stopped = 0
        for span in self.ledger.usage_spans(since_s, until_s):
            if span.device_class != self.device_class or span.gang_id.startswith(INFERENCE_PREFIX):
                continue
            trained += span.devices * (span.ended_at - span.started_at)
            if span.ended_by in STOPPED:
                recorded += span.lost_device_s
                stopped += span.devices
        return TrainingWork(trained, recorded, stopped)

    # -- acting ---------------------------------------------------------------------------
    def _request(self, index: int) -> GangRequest:
        return GangRequest(
            f"{INFERENCE_PREFIX}{index}",
            INFERENCE_TEAM,
            self.device_class,  # type: ignore[arg-type]
            self.model,
            1,
            self.node_gpus,
            INFERENCE_PRIORITY,
            preemptible=False,
        )

    def _reserve_one(self, index: int) -> bool:
        granted = self.ledger.try_acquire(self._request(index), "broker", RESERVATION_TTL_S)
        return isinstance(granted, Lease)

    def _free_index(self) -> int:
        taken = {int(x.gang_id.removeprefix(INFERENCE_PREFIX)) for x in self.reservations()}
        return next(i for i in range(len(taken) + 1) if i not in taken)

    def _stopped(self, gang_id: str) -> bool:
        if self.backend is None:
            return True
        status = self.backend.status(gang_id)
        return (status is None or status.state.finished) and left_nothing(self.backend, gang_id)

    def _take_back(self, gang_id: str, *, forced: bool = False) -> None:
        lease = self.ledger.lease_for(gang_id)
        if lease is None:
            return
        # A forced stop loses the work since the gang's last checkpoint: accounted so.
        store = self.checkpoint_store(gang_id) if self.checkpoint_store else None
        lost = (
            max(work_lost_at(self.ledger.clock(), lease.acquired_at, store), 1e-9)
            if forced
            else 0.0
        )
        self.ledger.release(lease.lease_id, lost_s=lost)

    def apply(self, decision: BrokerDecision) -> Applied:
        if self.tenant:
            return self._apply_as_tenant(decision)
        started = self.clock()
        current = self.inference_gpus()
        target = decision.inference_gpus
        if target < current:
            self._lend_down_to(target)
            return Applied(
                self.inference_gpus(), f"lent {current - target}", complete=True, waited_s=0.0
            )
        if target == current:
            return Applied(current, "nothing to move", complete=True, waited_s=0.0)

        # A local gang cannot drop workers while it runs: an elastic one that is to
        # shrink is stopped after a checkpoint like the others, and its operator asks
        # the ledger again, which grants what is left (down to its minimum).
        victims = self._ask_to_stop(decision)
        deadline = started + self.grace_s
        waiting = list(victims)
        forced: list[str] = []
        while True:
            for gang_id in list(waiting):
                if self._stopped(gang_id):
                    self._take_back(gang_id)
                    waiting.remove(gang_id)
            while self.inference_gpus() < target and self._reserve_one(self._free_index()):
                pass
            if self.inference_gpus() >= target or not waiting:
                break
            if self.clock() >= deadline:
                for gang_id in waiting:  # out of grace: stop it now, lose its uncommitted work
                    # its devices are taken back only once none of its processes runs
                    if self.backend is None or kill_gang(self.backend, gang_id):
                        self._take_back(gang_id, forced=True)
                    forced.append(gang_id)
                waiting.clear()
                while self.inference_gpus() < target and self._reserve_one(self._free_index()):
                    pass
                break
            self.sleep(self.poll_s)
        now = self.inference_gpus()
        return Applied(
            now,
            f"grew {now - current} of {target - current}"
            + (f"; forced {', '.join(forced)} after {self.grace_s:.0f} s" if forced else ""),
            complete=now >= target,
            preempted=tuple(victims),
            forced=tuple(forced),
            waited_s=self.clock() - started,
        )

    def _ask_to_stop(self, decision: BrokerDecision) -> list[str]:
        """The gangs the decision reclaims, each evicted in the ledger and asked to
        checkpoint and stop."""
        victims = [r.gang_id for r in decision.reclaims]
        for gang_id in victims:
            # Recorded in the ledger first, so that the gang's stop is journaled and
            # accounted as a preemption whoever frees its lease (its supervisor or us).
            self.ledger.evict(
                gang_id,
                INFERENCE_PREFIX.rstrip("/"),
                f"reclaimed by the broker for inference ({decision.reason})",
                self.grace_s,
                signalled=self.backend is not None,
            )
            if self.backend is not None:
                self.backend.preempt(gang_id)  # checkpoint, then exit resumable
        return victims

    # -- inference as a team of the cluster file --------------------------------------------
    def _lend_down_to(self, target: int) -> None:
        """Lend whole nodes back, newest reservations first."""
        for lease in sorted(self.reservations(), key=lambda x: x.gang_id, reverse=True):
            if self.inference_gpus() <= target:
                break
            self.ledger.release(lease.lease_id)

    def _carry_out_evictions(self) -> list[str]:
        """The ledger's evictions on the backend; the gangs forced to stop."""
        if self.backend is not None:
            steps = enforce_evictions(self.ledger, self.backend, clock=self._wall)
            return [s.gang_id for s in steps if s.action == "forced"]
        for eviction in self.ledger.evictions():  # no gangs to signal: they stop at once
            lease = self.ledger.lease_for(eviction.gang_id)
            if lease is not None:
                self.ledger.release(lease.lease_id)
        return []

    def _wall(self) -> float:
        return self.ledger.clock()  # eviction deadlines are on the ledger's clock

    def _apply_as_tenant(self, decision: BrokerDecision) -> Applied:
        """Grow by asking the ledger for reservations within inference's quota; the
        ledger reclaims what other teams borrowed of it, with their rules' grace."""
        started = self.clock()
        current = self.inference_gpus()
        target, capped_note = capped(decision.inference_gpus, self.capacity())
        if target <= current:
            self._lend_down_to(target)
            self._forget_waiting()
            moved = f"lent {current - target}" if target < current else "nothing to move"
            return Applied(self.inference_gpus(), moved + capped_note, complete=True, waited_s=0.0)
        preempted: dict[str, None] = {}  # in the order the ledger asked them
        forced: list[str] = []
        refusal = ""
        latest_deadline = started
        while True:
            index = self._free_index()
            granted = self.ledger.try_acquire(self._request(index), "broker", RESERVATION_TTL_S)
            if isinstance(granted, Lease):
                if self.inference_gpus() >= target:
                    break
                continue
            refusal = granted.reason
            mine = [e for e in self.ledger.evictions() if e.by_gang.startswith(INFERENCE_PREFIX)]
            for eviction in mine:
                preempted.setdefault(eviction.gang_id)
                latest_deadline = max(latest_deadline, eviction.deadline)
            if not mine:
                break  # nothing is being stopped for it: the quota or the nodes say no
            forced += [g for g in self._carry_out_evictions() if g in preempted]
            if self._wall() > latest_deadline + 10 * self.poll_s:
                break  # defensive: a forced stop frees its devices at the deadline
            self.sleep(self.poll_s)
        self._forget_waiting()
        now = self.inference_gpus()
        note = f"grew {now - current} of {target - current}" + capped_note
        if forced:
            note += f"; forced {', '.join(forced)} after its grace"
        if now < target and refusal:
            note += f"; the ledger: {refusal}"
        return Applied(
            now,
            note,
            complete=now >= target,
            preempted=tuple(preempted),
            forced=tuple(forced),
            waited_s=self.clock() - started,
        )

    def _forget_waiting(self) -> None:
        """A reservation the broker no longer asks for must not hold back training gangs."""
        for request, _ in self.ledger.waiting():
            if request.gang_id.startswith(INFERENCE_PREFIX):
                self.ledger.forget(request.gang_id)
