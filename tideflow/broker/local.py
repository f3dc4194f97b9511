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
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from tideflow.backends.protocol import Backend
from tideflow.broker.checkpoints import work_at_risk_since
from tideflow.broker.policy import Decision, GangView
from tideflow.scheduling import GangRequest, Lease, LeaseLedger

INFERENCE_TEAM = "inference"
INFERENCE_PREFIX = "broker/inference/"
INFERENCE_PRIORITY = 1_000_000  # ahead of every training gang in the ledger's queue
RESERVATION_TTL_S = 365 * 86400.0  # held until the broker lends it back


@dataclass(frozen=True)
class Applied:
    inference_gpus: int
    preempted: tuple[str, ...]
    forced: tuple[str, ...]  # cancelled after the grace: their uncommitted work is lost
    complete: bool  # the allocation reached the decision's
    waited_s: float
    note: str


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

    # -- reading the ledger -------------------------------------------------------------
    def _of_class(self) -> list[Lease]:
        return [lease for lease in self.ledger.leases() if lease.device_class == self.device_class]

    def reservations(self) -> list[Lease]:
        return [x for x in self._of_class() if x.gang_id.startswith(INFERENCE_PREFIX)]

    def inference_gpus(self) -> int:
        return sum(len(p.devices) for x in self.reservations() for p in x.placements)

    def total_gpus(self) -> int:
        return sum(
            n.devices for n in self.ledger.inventory.nodes if n.device_class == self.device_class
        )

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
            )
            for x in self._of_class()
            if not x.gang_id.startswith(INFERENCE_PREFIX) and x.preemptible
        )

    def idle_training_gpus(self) -> int:
        used = sum(len(p.devices) for x in self._of_class() for p in x.placements)
        return self.total_gpus() - used

    # -- acting ---------------------------------------------------------------------------
    def _reserve_one(self, index: int) -> bool:
        request = GangRequest(
            f"{INFERENCE_PREFIX}{index}",
            INFERENCE_TEAM,
            self.device_class,  # type: ignore[arg-type]
            self.model,
            1,
            self.node_gpus,
            INFERENCE_PRIORITY,
            preemptible=False,
        )
        return isinstance(self.ledger.try_acquire(request, "broker", RESERVATION_TTL_S), Lease)

    def _free_index(self) -> int:
        taken = {int(x.gang_id.removeprefix(INFERENCE_PREFIX)) for x in self.reservations()}
        return next(i for i in range(len(taken) + 1) if i not in taken)

    def _stopped(self, gang_id: str) -> bool:
        if self.backend is None:
            return True
        status = self.backend.status(gang_id)
        return status is None or status.state.finished

    def _take_back(self, gang_id: str) -> None:
        lease = self.ledger.lease_for(gang_id)
        if lease is not None:
            self.ledger.release(lease.lease_id)

    def apply(self, decision: Decision) -> Applied:
        started = self.clock()
        current = self.inference_gpus()
        target = decision.inference_gpus
        if target < current:  # lend whole nodes back, newest reservations first
            for lease in sorted(self.reservations(), key=lambda x: x.gang_id, reverse=True):
                if self.inference_gpus() <= target:
                    break
                self.ledger.release(lease.lease_id)
            return Applied(self.inference_gpus(), (), (), True, 0.0, f"lent {current - target}")
        if target == current:
            return Applied(current, (), (), True, 0.0, "nothing to move")

        # A local gang cannot drop workers while it runs: an elastic one that is to
        # shrink is stopped after a checkpoint like the others, and its operator asks
        # the ledger again, which grants what is left (down to its minimum).
        victims = [r.gang_id for r in decision.reclaims]
        for gang_id in victims:
            if self.backend is not None:
                self.backend.preempt(gang_id)  # checkpoint, then exit resumable
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
                    if self.backend is not None:
                        self.backend.cancel(gang_id)
                    self._take_back(gang_id)
                    forced.append(gang_id)
                waiting.clear()
                while self.inference_gpus() < target and self._reserve_one(self._free_index()):
                    pass
                break
            self.sleep(self.poll_s)
        now = self.inference_gpus()
        return Applied(
            now,
            tuple(victims),
            tuple(forced),
            now >= target,
            self.clock() - started,
            f"grew {now - current} of {target - current}"
            + (f"; forced {', '.join(forced)} after {self.grace_s:.0f} s" if forced else ""),
        )
