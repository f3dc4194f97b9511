"""The simulator's training side: a backlog of gangs queued, run, stopped and shrunk.

Queued gangs start in submission order with backfill when their whole gang
fits; running gangs advance window by window and commit a checkpoint every
``checkpoint_every_s``; a gang the broker stops checkpoints on notice when the
grace allows and goes back to the queue. Elastic gangs (``JobSpec.min_gpus``)
are shrunk instead, restart-based as on the local backend: the gang
checkpoints on notice, restarts on the workers it keeps (its start-up again)
and runs on at a speed in proportion to its GPUs; it grows back to full size,
with another restart, when the GPUs are free after the queue has been served.

Where gangs go is a ``Placement``: the product counts GPUs (the policy moves
whole nodes and gangs are whole nodes, so counting is placing).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from tideflow.broker.jobs import JobSpec
from tideflow.broker.policy import BrokerDecision, GangView, Snapshot

if TYPE_CHECKING:
    from tideflow.broker.simulation import Plan, SimulationConfig, Window


class Placement(Protocol):
    """Where the simulated cluster puts gangs and inference."""

    def inference_to(self, gpus: int) -> int:
        """Move inference to ``gpus``; the GPUs it holds after."""
        ...

    def place(self, gang: str, gpus: int, free: int) -> bool:
        """Start a gang whole on ``gpus`` of the ``free`` training GPUs, or not at all."""
        ...

    def resize(self, gang: str, gpus: int) -> bool:
        """Shrink a running gang, or grow it back; False when it cannot grow."""
        ...

    def release(self, gang: str) -> None: ...

    def nodes(self, gang: str) -> tuple[str, ...]:
        """The nodes a gang runs on, as the policy sees them (empty: not placed)."""
        ...

    def empty_nodes(self) -> int | None:
        """Training nodes no gang holds (None: the policy counts GPUs)."""
        ...

    def to_empty(self, inference_gpus: int, cost: Mapping[str, float]) -> list[str]:
        """Gangs to stop beyond the policy's victims so inference reaches its GPUs."""
        ...

    def metrics(self) -> dict[str, Any]: ...


class CountedGpus:
    """GPUs counted, not placed: a gang fits in any ``gpus`` free GPUs."""

    def inference_to(self, gpus: int) -> int:
        return gpus

    def place(self, gang: str, gpus: int, free: int) -> bool:
        return gpus <= free

    def resize(self, gang: str, gpus: int) -> bool:
        return True

    def release(self, gang: str) -> None:
        return None

    def nodes(self, gang: str) -> tuple[str, ...]:
        return ()

    def empty_nodes(self) -> int | None:
        return None

    def to_empty(self, inference_gpus: int, cost: Mapping[str, float]) -> list[str]:
        return []

    def metrics(self) -> dict[str, Any]:
        return {}


@dataclass
class SimulatedGang:
    spec: JobSpec
    progress_s: float = 0.0
    committed_s: float = 0.0
    first_start_s: float | None = None
    finished_s: float | None = None
    running: bool = False
    startup_left_s: float = 0.0
    started_once: bool = False
    preemptions: int = 0
    gpus_now: int = 0  # GPUs it runs on (below spec.gpus while shrunk)
    # Time spent queued, the waits after its preemptions included: the first wait alone
    # would flatter a policy that stops gangs more often.
    queued_s: float = 0.0
    queued_since: float | None = None  # while queued: since when

    @property
    def speed(self) -> float:
        """Progress (seconds of full-size work) per second of running."""
        return self.gpus_now / self.spec.gpus


class Backlog:
    """The training gangs of one simulation and the GPU time they gained and lost."""

    def __init__(self, jobs: list[JobSpec], config: SimulationConfig, placement: Placement) -> None:
        self.config = config
        self.placement = placement
        self.pending = sorted(jobs, key=lambda j: (j.submit_s, j.job_id))
        self.queue: list[SimulatedGang] = []  # submitted, not running, in submission order
        self.running: list[SimulatedGang] = []
        self.everyone: list[SimulatedGang] = []
        self.lost_gpu_s = 0.0
        self.preemptions = self.shrinks = 0
        self.busy: list[float] = []  # training GPU-seconds of progress per window
        self.lost_by_window: list[float] = []  # GPU-seconds lost, per window
        self._lost_before = 0.0

    def open_window(self, now: float, step: float) -> None:
        """Submit the gangs that arrive before the window ends."""
        self._lost_before = self.lost_gpu_s
        while self.pending and self.pending[0].submit_s < now + step:
            job = SimulatedGang(self.pending.pop(0))
            job.queued_since = job.spec.submit_s
            self.queue.append(job)
            self.everyone.append(job)

    def close_window(self, busy_gpu_s: float) -> None:
        self.busy.append(busy_gpu_s)
        self.lost_by_window.append(self.lost_gpu_s - self._lost_before)

    def held(self) -> int:
        return sum(j.gpus_now for j in self.running)

    def views(self, now: float) -> tuple[GangView, ...]:
        """The running gangs as the policy sees them."""
        return tuple(
            GangView(
                j.spec.job_id,
                j.gpus_now,
                j.spec.priority,
                now - (j.progress_s - j.committed_s) / j.speed,
                j.spec.min_gpus if self.config.elastic else None,
                self.placement.nodes(j.spec.job_id),
            )
            for j in self.running
        )

    def snapshot(
        self, now: float, inference: int, plan: Plan, last_lend_s: float | None
    ) -> Snapshot:
        """What the policy sees at ``now``: the plan's load, the GPUs, the running gangs."""
        return Snapshot(
            now_s=now,
            inference_gpus=inference,
            measured_rps=plan.measured_rps,
            forecast=plan.forecast,
            idle_training_gpus=self.config.total_gpus - inference - self.held(),
            gangs=self.views(now),
            last_lend_s=last_lend_s,
            lend_forecast=plan.lend_forecast,
            empty_nodes=self.placement.empty_nodes(),
        )

    def apply(self, decision: BrokerDecision, now: float) -> int:
        """Shrink and stop what the decision reclaims, then what its placement must
        empty for inference; the gangs stopped."""
        stopped = 0
        by_id = {j.spec.job_id: j for j in self.running}
        for reclaim in decision.reclaims:
            victim = by_id[reclaim.gang_id]
            if not reclaim.evicted:
                self.lost_gpu_s += self._resize(victim, victim.gpus_now - reclaim.gpus)
                self.placement.resize(victim.spec.job_id, victim.gpus_now)
                self.shrinks += 1
                continue
            self._stop(victim, now)
            stopped += 1
        by_id = {j.spec.job_id: j for j in self.running}
        costs = {gang: self._at_risk(j) for gang, j in by_id.items()}
        while extra := self.placement.to_empty(decision.inference_gpus, costs):
            for gang in extra:
                self._stop(by_id.pop(gang), now)
                stopped += 1
        self.queue.sort(key=lambda j: (j.spec.submit_s, j.spec.job_id))
        self.preemptions += stopped
        return stopped

    def fill(self, now: float, free: int) -> None:
        """Start queued gangs that fit whole, in submission order (backfill smaller ones);
        then shrunk gangs grow back into what the queue left free."""
        restart_s = self.config.restart_overhead_s
        for job in list(self.queue):
            if self.placement.place(job.spec.job_id, job.spec.gpus, free):
                self.queue.remove(job)
                self.running.append(job)
                free -= job.spec.gpus
                job.gpus_now = job.spec.gpus
                job.running = True
                if job.first_start_s is None:
                    job.first_start_s = now
                if job.queued_since is not None:
                    job.queued_s += now - job.queued_since
                    job.queued_since = None
                job.startup_left_s = restart_s
                if job.started_once:  # start-up after a preemption is lost GPU time
                    self.lost_gpu_s += restart_s * job.spec.gpus
                job.started_once = True
        for job in self.running:
            if job.gpus_now < job.spec.gpus <= free + job.gpus_now and (
                self.placement.resize(job.spec.job_id, job.spec.gpus)
            ):
                free -= job.spec.gpus - job.gpus_now
                self.lost_gpu_s += self._resize(job, job.spec.gpus)

    def advance(self, now: float, step: float) -> float:
        """Run the running gangs through the window; the GPU-seconds of progress made."""
        busy_gpu_s = 0.0
        for job in list(self.running):
            available = step
            warmup = min(job.startup_left_s, available)
            job.startup_left_s -= warmup
            available -= warmup
            remaining = job.spec.work_s - job.progress_s
            used = min(available * job.speed, remaining)  # full-size seconds of work
            job.progress_s += used
            busy_gpu_s += used * job.spec.gpus
            if job.progress_s >= job.spec.work_s - 1e-9:
                job.finished_s = now + warmup + used / job.speed
                job.committed_s = job.progress_s = job.spec.work_s
                job.running = False
                self.running.remove(job)
                self.placement.release(job.spec.job_id)
            else:
                every = job.spec.checkpoint_every_s
                job.committed_s = math.floor(job.progress_s / every) * every
        return busy_gpu_s

    def metrics(
        self, windows: Sequence[Window], forecast_errors: Sequence[float], end_s: float
    ) -> dict[str, Any]:
        """The simulation's scores: inference served, training's goodput, loss and waits."""
        config = self.config
        step = windows[1].start_s - windows[0].start_s if len(windows) > 1 else 600.0
        busy, jobs, lost_gpu_s = self.busy, self.everyone, self.lost_gpu_s
        # data gaps have no known need: they are not scored
        scored = [(w.needed, w.inference_gpus) for w in windows if w.needed is not None]
        short = [max(0, need - alloc) for need, alloc in scored]
        serving = sum(min(need, alloc) * step for need, alloc in scored)
        goodput_s = sum(j.committed_s * j.spec.gpus for j in jobs)
        started = [j for j in jobs if j.first_start_s is not None]
        finished = [(j.finished_s, j.spec.submit_s) for j in jobs if j.finished_s is not None]
        waits = [
            (j.first_start_s if j.first_start_s is not None else end_s) - j.spec.submit_s
            for j in jobs
        ]
        queued = [
            j.queued_s + (end_s - j.queued_since if j.queued_since is not None else 0.0)
            for j in jobs
        ]

        def hours(seconds: Sequence[float]) -> float | None:
            return round(statistics.fmean(seconds) / 3600, 2) if seconds else None

        return {
            "windows": len(windows),
            "gap_windows": len(windows) - len(scored),
            "per_gpu_rps": config.per_gpu_rps,
            "training_goodput_gpu_hours": round(goodput_s / 3600, 1),
            "underprovisioned_gpu_minutes": round(sum(short) * step / 60, 1),
            "slo_attainment": round(sum(1 for s in short if s == 0) / len(scored), 5)
            if scored
            else None,
            "preemptions": self.preemptions,
            "lost_gpu_hours": round(lost_gpu_s / 3600, 2),
            "lost_fraction_of_training": round(lost_gpu_s / max(1.0, sum(busy)), 5),
            "mean_gpu_utilization": round(
                (serving + sum(busy)) / (config.total_gpus * step * len(windows)), 4
            ),
            "mean_inference_gpus": round(statistics.fmean(w.inference_gpus for w in windows), 1),
            "forecast_mape": round(statistics.fmean(forecast_errors), 4)
            if forecast_errors
            else None,
            "jobs_submitted": len(jobs),
            "jobs_started": len(started),
            "jobs_finished": len(finished),
            # jobs never started count as waiting until the end (a lower bound on their wait)
            "mean_queueing_hours": hours(waits),
            # every wait, the requeues after preemptions too (jobs still queued: until the end)
            "mean_total_queueing_hours": hours(queued),
            "mean_jct_hours": hours([done - submit for done, submit in finished]),
            "shrinks": self.shrinks,
        }

    def _stop(self, victim: SimulatedGang, now: float) -> None:
        """Stop a running gang and queue it again."""
        self.lost_gpu_s += self._checkpoint_on_notice(victim)
        victim.running = False
        victim.preemptions += 1
        self.running.remove(victim)
        self.queue.append(victim)
        victim.queued_since = now
        self.placement.release(victim.spec.job_id)

    def _checkpoint_on_notice(self, job: SimulatedGang) -> float:
        """GPU-seconds lost when a running gang is told to stop: the checkpoint it writes
        if the grace allows (nothing to redo then), else its work since the last one."""
        lost = 0.0
        if job.startup_left_s <= 0 and self.config.checkpoint_write_s <= self.config.grace_s:
            job.committed_s = job.progress_s  # checkpoint-before-evict: nothing to redo
            lost += self.config.checkpoint_write_s * job.gpus_now
        lost += (job.progress_s - job.committed_s) * job.spec.gpus
        job.progress_s = job.committed_s
        return lost

    def _at_risk(self, job: SimulatedGang) -> float:
        """GPU-seconds a stop of this gang would cost now (what emptying its node weighs)."""
        return (job.progress_s - job.committed_s) * job.spec.gpus + (
            self.config.restart_overhead_s * job.gpus_now
        )

    def _resize(self, job: SimulatedGang, gpus: int) -> float:
        """Restart a running elastic gang on ``gpus`` GPUs; GPU-seconds lost."""
        lost = self._checkpoint_on_notice(job)
        job.gpus_now = gpus
        job.startup_left_s = self.config.restart_overhead_s
        return lost + self.config.restart_overhead_s * gpus
