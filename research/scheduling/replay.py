"""Replay a stream of gangs through the real lease ledger on a simulated clock.

The decisions are the ledger's own (``LeaseLedger.try_acquire`` with the cluster
file's teams: quotas, borrowing, preemption); this module plays the rest of
the system around it, as the gang layer does:

* a gang asks when it arrives, and again whenever something changed that could
  let it in: a lease ended, or a moment the policy depends on passed (a waiter
  reaching ``reserve_after``, a loan reaching its ``auto_return_timeout``). Real
  triggers poll every few seconds; polling at exactly the moments that can
  change an answer gives the same decisions without millions of no-op calls;
* a gang the ledger wants stopped (``evictions()``) checkpoints and stops:
  with checkpoint-on-signal it writes a checkpoint (``save_s``) and loses
  nothing if that ends within its grace; without, it stops at its next periodic
  checkpoint. Only when the grace ends first is it stopped anyway, losing the
  work since its last checkpoint (``release(lost_s=...)``);
* a stopped gang asks again and resumes from its checkpoint with the work it
  has left (after ``restart_s`` of reloading).

Everything is seeded: the same stream replayed under two cluster specs
(``static_quotas`` derives the no-borrowing, no-preemption one) differs only in
the policy. ``Result`` has what the benchmark reports, per team.
"""

from __future__ import annotations

import heapq
import math
import statistics
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from research.scheduling.outcomes import JobOutcome, Result, TeamFigures
from research.scheduling.streams import DAY, HOUR, Job
from tideflow.inventory import ClusterSpec, Inventory
from tideflow.scheduling.ledger import LeaseLedger
from tideflow.scheduling.model import GangRequest, Lease

_FOREVER = 1e12  # leases and waiters never expire in a replay: every gang stays in touch


@dataclass
class _Run:
    lease: Lease
    start: float
    resumed_from: float  # checkpointed work it started with
    stop_at: float | None = None  # when it stops for an eviction (None: not asked)
    forced: bool = False


class InvariantError(AssertionError):
    """The replay saw something the ledger must never do (a device booked twice)."""


class Replay:
    """One stream through one ledger on a simulated clock."""

    def __init__(
        self,
        spec: ClusterSpec,
        jobs: Iterable[Job],
        *,
        policy: str,
        path: Path | None = None,
        kills: dict[str, float] | None = None,
    ) -> None:
        self.policy = policy
        # Gangs a person stops by hand at a moment (without a checkpoint: all the work
        # of that run is lost), then submits again: what teams do without preemption.
        self.kills = dict(kills or {})
        self.inventory = Inventory.from_spec(spec)
        self.now = 0.0
        # A replay commits hundreds of thousands of transactions: on tmpfs where there
        # is one, so that the figures measure the policy rather than the disk's fsync.
        shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
        self._dir = None if path is not None else tempfile.TemporaryDirectory(dir=shm)
        db = path if path is not None else Path(self._dir.name) / "ledger.db"  # type: ignore[union-attr]
        self.ledger = LeaseLedger(
            db,
            self.inventory,
            clock=lambda: self.now,
            waiter_timeout_s=_FOREVER,
            work_at_risk=self._work_at_risk,
        )
        teams = self.ledger.teams
        self.jobs = {j.gang_id: j for j in jobs}
        self.out = {g: JobOutcome(j) for g, j in self.jobs.items()}
        self.requests: dict[str, GangRequest] = {}
        for job in self.jobs.values():
            priority, name = (
                (0, None) if teams is None else teams.priority(job.team, job.priority_class)
            )
            self.requests[job.gang_id] = GangRequest(
                job.gang_id,
                job.team,
                "gpu",
                None,
                job.workers,
                job.devices_per_worker,
                priority=priority,
                priority_class=name,
            )
        self.done: dict[str, float] = {g: 0.0 for g in self.jobs}  # checkpointed work
        self.running: dict[str, _Run] = {}
        self.waiting: dict[str, float] = {}  # gang -> queued since
        self.claimed: dict[tuple[str, int], str] = {}  # the replay's own view of devices
        self.events: list[tuple[float, int, str, str, str]] = []  # at, seq, kind, gang, lease
        self._seq = 0
        self._ticks: set[float] = set()
        self.decisions = 0
        self.reserve_after = None if teams is None else teams.reserve_after_s
        self.auto_return = (
            {} if teams is None else {k: r.auto_return_timeout for k, r in teams.rules.items()}
        )

    # -- the gang's side -------------------------------------------------------------------
    def _progress(self, gang: str, at: float) -> float:
        run, job = self.running[gang], self.jobs[gang]
        return min(job.work_s, run.resumed_from + max(0.0, at - run.start - job.restart_s))

    def _checkpointed(self, gang: str, at: float) -> float:
        run, job = self.running[gang], self.jobs[gang]
        since = self._progress(gang, at) - run.resumed_from
        return (
            run.resumed_from + math.floor(since / job.checkpoint_every_s) * job.checkpoint_every_s
        )

    def _work_at_risk(self, lease: Lease, now: float) -> float:
        if lease.gang_id not in self.running:
            return 0.0
        return self._progress(lease.gang_id, now) - self._checkpointed(lease.gang_id, now)

    def _push(self, at: float, kind: str, gang: str = "", lease_id: str = "") -> None:
        self._seq += 1
        heapq.heappush(self.events, (at, self._seq, kind, gang, lease_id))

    def _start(self, gang: str, lease: Lease) -> None:
        job, out = self.jobs[gang], self.out[gang]
        for p in lease.placements:
            for device in p.devices:
                other = self.claimed.get((p.node, device))
                if other is not None:
                    raise InvariantError(
                        f"{p.node} gpu {device} granted to {gang} while {other} holds it"
                    )
                self.claimed[(p.node, device)] = gang
        if lease.devices != job.devices:
            raise InvariantError(f"{gang} asked for {job.devices} devices, got {lease.devices}")
        out.waited_s += self.now - self.waiting.pop(gang)
        if out.first_start is None:
            out.first_start = self.now
        out.runs += 1
        self.running[gang] = _Run(lease, self.now, self.done[gang])
        finish = self.now + job.restart_s + (job.work_s - self.done[gang])
        self._push(finish, "finish", gang, lease.lease_id)

    def _end(self, gang: str, *, saved: float, lost: float, save_s: float = 0.0) -> None:
        run = self.running.pop(gang)
        out, job = self.out[gang], self.jobs[gang]
        for p in run.lease.placements:
            for device in p.devices:
                del self.claimed[(p.node, device)]
        held = self.now - run.start
        out.held_device_s += held * job.devices
        out.borrowed_device_s += held * run.lease.borrowed
        out.lost_s += lost
        # Held time that was no work: reloading (cut short if it was stopped meanwhile)
        # and the checkpoint written on the way out.
        out.overhead_s += min(job.restart_s, held - save_s) + save_s
        self.ledger.release(run.lease.lease_id, lost_s=lost)
        self.done[gang] = saved
        if saved >= job.work_s:
            out.finished = self.now
        else:
            self.waiting[gang] = self.now  # it asks again, from its checkpoint

    def _stop_plan(self, gang: str, asked: float, deadline: float) -> tuple[float, bool]:
        """When a gang asked at ``asked`` to stop does stop, and whether it is forced."""
        run, job = self.running[gang], self.jobs[gang]
        if job.save_s is not None and asked + job.save_s <= deadline:
            return asked + job.save_s, False
        if job.save_s is None:
            running_from = run.start + job.restart_s
            if asked <= running_from:
                return asked, False  # nothing done since it resumed: nothing to lose
            k = math.floor((asked - running_from) / job.checkpoint_every_s) + 1
            at = running_from + k * job.checkpoint_every_s
            if at <= deadline:
                return at, False
        return deadline, True

    # -- the loop ------------------------------------------------------------------------
    def _ask(self, gangs: Sequence[str]) -> int:
        granted = 0
        for gang in gangs:
            if gang not in self.waiting:
                continue
            self.decisions += 1
            answer = self.ledger.try_acquire(self.requests[gang], f"replay-{gang}", _FOREVER)
            if isinstance(answer, Lease):
                self._start(gang, answer)
                granted += 1
            elif answer.never:
                raise InvariantError(f"{gang} can never fit: {answer.reason}")
        return granted

    def _schedule(self, only: Sequence[str] | None) -> None:
        if only is not None:
            self._ask(only)
        # Ask everyone until a round grants nothing: a grant can unblock a gang asked
        # earlier in the round (it waited behind the one just granted).
        while only is None and self._ask(sorted(self.waiting, key=self._order)):
            pass
        for record in self.ledger.evictions():
            run = self.running.get(record.gang_id)
            if run is None or run.stop_at is not None:
                continue
            run.stop_at, run.forced = self._stop_plan(
                record.gang_id, record.requested_at, record.deadline
            )
            self._push(run.stop_at, "stop", record.gang_id, run.lease.lease_id)
        self._plan_ticks()

    def _order(self, gang: str) -> tuple[int, float]:
        return (-self.requests[gang].priority, self.waiting[gang])

    def _plan_ticks(self) -> None:
        """Moments at which the policy's answer can change with time alone."""
        moments: list[float] = []
        if self.reserve_after is not None:
            moments += [q + self.reserve_after for q in self.waiting.values()]
        if self.waiting:
            for run in self.running.values():
                lease = run.lease
                timeout = self.auto_return.get((lease.lender or "", lease.team))
                if lease.borrowed and timeout is not None:
                    moments.append(run.start + timeout)
        for at in moments:
            if at > self.now and at not in self._ticks:
                self._ticks.add(at)
                self._push(at, "tick")

    def run(self, window_s: float) -> Result:
        for job in self.jobs.values():
            self._push(job.arrival_s, "arrive", job.gang_id)
        for gang, at in self.kills.items():
            self._push(at, "kill", gang)
        while self.events:
            at, _, kind, gang, lease_id = heapq.heappop(self.events)
            self.now = at
            arrived: list[str] = []
            changed = False
            batch = [(kind, gang, lease_id)]
            while self.events and self.events[0][0] == at:
                _, _, k, g, lid = heapq.heappop(self.events)
                batch.append((k, g, lid))
            for k, g, lid in batch:
                run = self.running.get(g)
                if k in ("finish", "stop") and (run is None or run.lease.lease_id != lid):
                    continue  # stale: that run already ended
                if k == "arrive":
                    self.waiting[g] = at
                    arrived.append(g)
                elif k == "kill":
                    if run is not None:
                        # A restart from scratch: the checkpoints were of the old run.
                        self._end(g, saved=0.0, lost=self._progress(g, at))
                        self.out[g].forced += 1
                        changed = True
                elif k == "finish" and run is not None:
                    self._end(g, saved=self.jobs[g].work_s, lost=0.0)
                    changed = True
                elif k == "stop" and run is not None:
                    job = self.jobs[g]
                    if run.forced:
                        saved = self._checkpointed(g, at)
                        self._end(g, saved=saved, lost=self._progress(g, at) - saved)
                    elif job.save_s is not None:
                        asked = at - job.save_s  # it saved what it had when asked
                        self._end(g, saved=self._progress(g, asked), lost=0.0, save_s=job.save_s)
                    else:
                        self._end(g, saved=self._progress(g, at), lost=0.0)
                    self.out[g].preemptions += 1
                    self.out[g].forced += int(run.forced)
                    changed = True
                else:
                    changed = True
            self._schedule(None if changed else arrived)
        if self.waiting:
            reasons = self.ledger.waiting_reasons()
            shown = "; ".join(f"{g}: {reasons.get(g, '?')}" for g in list(self.waiting)[:3])
            raise InvariantError(
                f"stalled at {self.now / DAY:.2f} days: {len(self.waiting)} gang(s) wait, "
                f"{len(self.running)} run, and nothing is left to happen ({shown})"
            )
        unfinished = [g for g, o in self.out.items() if o.finished is None]
        if unfinished:
            raise InvariantError(f"{len(unfinished)} gang(s) never finished: {unfinished[:5]}")
        return self._result(window_s)

    # -- figures ---------------------------------------------------------------------------
    def _result(self, window_s: float) -> Result:
        teams = self.ledger.teams
        total = self.inventory.total("gpu")
        spans = self.ledger.usage_spans(0.0, window_s)
        held_s: dict[str, float] = {}
        borrowed_s: dict[str, float] = {}
        for span in spans:
            seconds = span.ended_at - span.started_at
            held_s[span.team] = held_s.get(span.team, 0.0) + seconds * span.devices
            borrowed_s[span.team] = borrowed_s.get(span.team, 0.0) + seconds * span.borrowed
        figures: dict[str, TeamFigures] = {}
        for team in sorted({j.team for j in self.jobs.values()}):
            outs = [o for o in self.out.values() if o.job.team == team]
            waits = sorted(o.first_wait_s / HOUR for o in outs)
            nominal = 0 if teams is None else teams.nominal(team, ("gpu", None))
            dh = held_s.get(team, 0.0) / HOUR
            figures[team] = TeamFigures(
                team,
                len(outs),
                statistics.fmean(waits),
                _percentile(waits, 0.95),
                statistics.fmean(o.waited_s / HOUR for o in outs),
                dh / (nominal * window_s / HOUR) if nominal else 0.0,
                dh / (total * window_s / HOUR),
                dh - borrowed_s.get(team, 0.0) / HOUR,
                borrowed_s.get(team, 0.0) / HOUR,
                sum(o.preemptions for o in outs),
                sum(o.forced for o in outs),
                sum(o.lost_s * o.job.devices for o in outs) / HOUR,
            )
        finished = [o.finished for o in self.out.values() if o.finished is not None]
        return Result(
            self.policy,
            window_s,
            total,
            self.out,
            figures,
            sum(held_s.values()) / (total * window_s),
            max(finished, default=0.0),
            self.decisions,
        )

    def check_conservation(self) -> None:
        """Device-time the ledger recorded equals device-time the gangs held, and each
        gang's held time is its work plus lost work plus restarts and saves."""
        spans = self.ledger.usage_spans(0.0, self.now + 1)
        ledger_s = sum((s.ended_at - s.started_at) * s.devices for s in spans)
        replay_s = sum(o.held_device_s for o in self.out.values())
        if not math.isclose(ledger_s, replay_s, rel_tol=1e-9, abs_tol=1e-3):
            raise InvariantError(f"ledger holds {ledger_s} device-s, the gangs {replay_s}")
        for o in self.out.values():
            expect = (o.job.work_s + o.lost_s + o.overhead_s) * o.job.devices
            if not math.isclose(o.held_device_s, expect, rel_tol=1e-9, abs_tol=1e-3):
                raise InvariantError(
                    f"{o.job.gang_id}: held {o.held_device_s} device-s, work accounts for {expect}"
                )


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1)]


def replay(
    spec: ClusterSpec,
    jobs: Iterable[Job],
    *,
    policy: str,
    window_s: float,
    check: bool = True,
    kills: dict[str, float] | None = None,
) -> Result:
    """Replay ``jobs`` under ``spec``'s teams; ``check`` verifies device-time conservation."""
    run = Replay(spec, jobs, policy=policy, kills=kills)
    result = run.run(window_s)
    if check:
        run.check_conservation()
    return result
