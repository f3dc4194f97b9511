"""What a simulation is set up with and what it gives: its setup, the policy's view of
each window, each window's record and the result (``tideflow.broker.simulate`` runs it;
the backlog of gangs reads the setup).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from tideflow.broker.forecast import Forecast
from tideflow.broker.policy import PolicyConfig

# The simulator runs the policy with the running broker's defaults: one place for each.
_POLICY: dict[str, Any] = {f.name: f.default for f in fields(PolicyConfig)}


@dataclass(frozen=True)
class SimulationConfig:
    policy: str  # "tidal", "static:N" (N GPUs for inference) or "cron:H" (headroom H)
    total_gpus: int = 200
    node_gpus: int = _POLICY["node_gpus"]
    per_gpu_rps: float = 25.0
    headroom: float = _POLICY["headroom"]
    lead_s: float = _POLICY["lead_s"]  # one window: reclaiming with a checkpoint fits in it
    forecast_quantile: float = 0.99
    lend_horizon_s: float = _POLICY["lend_horizon_s"]
    lend_quantile: float = _POLICY["lend_quantile"]
    cooldown_s: float = _POLICY["cooldown_s"]
    min_inference_gpus: int = _POLICY["min_inference_gpus"]
    restart_overhead_s: float = 300.0  # a restarted gang's start-up, GPU time without progress
    checkpoint_write_s: float = 60.0  # time for a gang to write its checkpoint on notice
    grace_s: float = _POLICY["checkpoint_grace_s"]  # how long the broker waits for it
    # Scale the forecast's upper bound online to meet this SLO (None: uncalibrated).
    slo_target: float | None = 0.995
    slo_step: float = 0.05  # the calibration's step per window (``SloCalibration.step``)
    elastic: bool = True  # shrink elastic gangs instead of stopping them (False: all rigid)
    # Scale the lend horizon's bound online to spend this share of training GPU-time on
    # preemptions (None: a fixed lend bound): under budget lend more, over it less.
    lost_work_budget: float | None = _POLICY["lost_work_budget"]
    lost_work_low: float = -0.25  # under budget the lend bound shrinks to exp(-0.25) = 0.78x
    lost_work_high: float = 0.0  # over budget: the fixed bound (> 0: a brake, holding more)
    # The budget counts the work lost and done over this past span, as the running
    # broker reads it from the ledger (None: since the start of the trace).
    lost_work_window_s: float | None = 7 * 86400.0

    def static_gpus(self) -> int | None:
        if self.policy == "tidal" or self.cron_headroom() is not None:
            return None
        kind, _, value = self.policy.partition(":")
        if kind != "static" or not value.isdigit():
            raise ValueError(
                f"policy {self.policy!r}: use 'tidal', 'static:N' (N GPUs for inference) "
                "or 'cron:H' (an hour-of-day schedule with headroom H, e.g. cron:0.2)"
            )
        node, total = self.node_gpus, self.total_gpus
        if not 0 <= int(value) <= total or int(value) % max(node, 1):
            # the broker moves whole nodes: a split inside a node is not one it can hold
            raise ValueError(
                f"policy {self.policy!r}: N is inference's GPUs in whole {node}-GPU nodes "
                f"of the {total}: accepted: 0, {node}, {2 * node}, ... {total // node * node}"
            )
        return int(value)

    def cron_headroom(self) -> float | None:
        kind, _, value = self.policy.partition(":")
        if kind != "cron":
            return None
        try:
            headroom = float(value)
        except ValueError:
            headroom = -1.0
        if not 0 <= headroom < 10:
            raise ValueError(f"policy {self.policy!r}: H is a headroom fraction >= 0 (cron:0.2)")
        return headroom

    def policy_config(self) -> PolicyConfig:
        return PolicyConfig(
            total_gpus=self.total_gpus,
            per_gpu_rps=self.per_gpu_rps,
            node_gpus=self.node_gpus,
            headroom=self.headroom,
            min_inference_gpus=self.min_inference_gpus,
            lead_s=self.lead_s,
            lend_horizon_s=self.lend_horizon_s,
            lend_quantile=self.lend_quantile,
            cooldown_s=self.cooldown_s,
            checkpoint_grace_s=self.grace_s,
        )


@dataclass(frozen=True)
class Window:
    start_s: float
    rate: float | None
    forecast_upper: float | None
    needed: int | None
    inference_gpus: int
    training_gpus: int
    preempted: int
    action: str
    reason: str


@dataclass
class SimulationResult:
    config: SimulationConfig
    metrics: dict[str, Any]
    windows: list[Window] = field(default_factory=list)

    def to_json(self, timeline: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"policy": self.config.policy, **self.metrics}
        out["config"] = asdict(self.config)
        if timeline:
            out["timeline"] = [asdict(w) for w in self.windows]
        return out


@dataclass(frozen=True)
class Plan:
    """What the policy sees of the load in one window."""

    forecast: Forecast  # over the lead
    lend_forecast: Forecast  # over the lend horizon
    measured_rps: float | None  # the last window's load (None: a gap)
    forget_lend: bool = False  # True: no cooldown after the last lend this window
