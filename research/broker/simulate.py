"""The product simulator with the benchmark's references: bounds and node placement.

``ResearchConfig`` is the product's ``SimulationConfig`` with what only the
benchmark asks of it: the bound policies (``research.broker.bounds``), what
they keep of tidal's mechanics, their rooms and quantiles, and placing gangs
and inference on nodes (``research.broker.nodes``) instead of counting GPUs.
``simulate`` runs the product's event loop (``tideflow.broker.simulate.replay``)
with them.
"""

from __future__ import annotations

from dataclasses import dataclass

from research.broker.bounds import (
    BOUNDS,
    FORECAST_BOUNDS,
    MECHANICS,
    BurstBlindPlanner,
    HindsightPlanner,
    OraclePlanner,
    burst_blind_plan,
    hindsight_fitted,
    lend_windows,
)
from research.broker.nodes import NodePlacement
from tideflow.broker.forecast import clean_outages
from tideflow.broker.jobs import JobSpec
from tideflow.broker.load import LoadSample, LoadSource
from tideflow.broker.simulate import (
    Planner,
    TidalPlanner,
    planner_for,
    replay,
    trace_samples,
)
from tideflow.broker.simulation import SimulationConfig, SimulationResult


@dataclass(frozen=True)
class ResearchConfig(SimulationConfig):
    # Besides the product's policies, a bound: "oracle" (knows each window's load),
    # "oracle-burst-blind" (knows it but for the bursts, on a load that says where they
    # are; ``insured_share`` below) or "oracle-hindsight[-cross]".
    #
    # "gpus": gangs and inference counted in GPUs; "nodes": placed on nodes
    # (``research.broker.nodes``), so fragmentation can keep a gang waiting and make
    # inference's growth stop more gangs than the policy chose.
    placement: str = "gpus"
    # With placement "nodes": the policy sees each gang's nodes and the empty ones, and
    # chooses victims that empty whole nodes (False: victims chosen by count).
    node_aware: bool = True
    # The burst-blind bound holds room for a burst in this share of the windows, the
    # ones of least load (where that room costs least), and none elsewhere.
    insured_share: float = 0.5
    # The room it holds in those windows, as a multiple of the calm load (None: the
    # load's burst factor, room for a whole burst).
    burst_room: float | None = None
    # The hindsight bounds: the regression's quantile, and the room held over it (their
    # bound scaled by this, as tidal's calibration scales its forecast's).
    hindsight_quantile: float = 0.995
    hindsight_room: float = 1.0
    # What the "oracle" and "oracle-hindsight[-cross]" bounds keep of tidal besides its
    # next-window forecast, to tell what tidal loses to its forecast from what it loses
    # to its mechanics: "lean" (neither: no cooldown, a lend bound read from their own
    # bounds ahead), "cooldown" (tidal's cooldown between lends), "lend" (tidal's lend
    # bound, with its lost-work budget, which sees only the past) or "tidal" (both).
    bound_mechanics: str = "lean"

    def __post_init__(self) -> None:
        if self.placement not in ("gpus", "nodes"):
            raise ValueError(
                f"placement {self.placement!r}: use 'gpus' (counted) or 'nodes' (placed)"
            )
        if self.placement == "nodes" and self.total_gpus % self.node_gpus:
            raise ValueError(
                f"placement 'nodes': total_gpus {self.total_gpus} is not whole nodes of "
                f"{self.node_gpus}"
            )
        if self.burst_room is not None and not self.burst_room >= 1:
            raise ValueError(
                f"burst_room must be at least 1, the calm load, or None for the load's "
                f"burst factor (got {self.burst_room})"
            )
        if not self.hindsight_room > 0:
            raise ValueError(f"hindsight_room must be > 0 (got {self.hindsight_room})")
        if self.bound_mechanics not in MECHANICS:
            raise ValueError(
                f"bound_mechanics {self.bound_mechanics!r}: use one of "
                + ", ".join(repr(m) for m in MECHANICS)
                + " (what the oracle and hindsight bounds keep of tidal's mechanics)"
            )
        if self.bound_mechanics != "lean" and self.policy not in FORECAST_BOUNDS:
            raise ValueError(
                f"bound_mechanics {self.bound_mechanics!r} applies to the policies "
                + ", ".join(repr(p) for p in FORECAST_BOUNDS)
                + f" only (got policy {self.policy!r})"
            )

    @property
    def bound_keeps_cooldown(self) -> bool:
        """Whether a bound waits out tidal's cooldown between lends (policies always do)."""
        return self.bound_mechanics in ("cooldown", "tidal")

    @property
    def tidal_lend_bound(self) -> bool:
        """Whether the lend bound is tidal's (from the past, spending the budget)."""
        return self.policy == "tidal" or (
            self.policy in FORECAST_BOUNDS and self.bound_mechanics in ("lend", "tidal")
        )

    def static_gpus(self) -> int | None:
        if self.policy in BOUNDS:
            return None
        kind = self.policy.partition(":")[0]
        if self.policy != "tidal" and kind not in ("static", "cron"):
            raise ValueError(
                f"policy {self.policy!r}: use 'tidal', 'static:N' (N GPUs for inference), "
                "'cron:H' (an hour-of-day schedule with headroom H, e.g. cron:0.2), "
                "'oracle' (a bound that knows each window's load), 'oracle-burst-blind' "
                "(a bound that knows it but for the bursts) or 'oracle-hindsight[-cross]' "
                "(a forecast fitted to the trace itself, or to its other half)"
            )
        return super().static_gpus()


def simulate(
    load: LoadSource,
    jobs: list[JobSpec],
    config: ResearchConfig,
    *,
    start_s: float | None = None,
    end_s: float | None = None,
) -> SimulationResult:
    """The product's ``simulate``, with the bounds and node placement ``config`` asks."""
    config.static_gpus()  # an unknown policy is refused before any work
    raw, end = trace_samples(load, start_s, end_s)
    samples = clean_outages(raw)
    step = load.window_s
    placement = (
        NodePlacement(
            config.total_gpus // config.node_gpus, config.node_gpus, node_aware=config.node_aware
        )
        if config.placement == "nodes"
        else None
    )
    planner = _bound_planner(config, load, raw, samples, step) or planner_for(config, step)
    return replay(samples, jobs, config, planner, window_s=step, end_s=end, placement=placement)


def _bound_planner(
    config: ResearchConfig,
    load: LoadSource,
    raw: list[LoadSample],
    samples: list[LoadSample],
    step: float,
) -> Planner | None:
    """The planner of a bound policy (None: one of the product's)."""
    if config.policy not in BOUNDS:
        return None
    ahead = lend_windows(config.lend_horizon_s, step)
    tidal_lend, keeps_cooldown = config.tidal_lend_bound, config.bound_keeps_cooldown
    if config.policy == "oracle":
        tidal = TidalPlanner(config, step, calibrated=True, budgeted=tidal_lend)
        return OraclePlanner(tidal, tidal_lend=tidal_lend, keeps_cooldown=keeps_cooldown)
    tidal = TidalPlanner(config, step, calibrated=False, budgeted=tidal_lend)
    if config.policy == "oracle-burst-blind":
        base, held = burst_blind_plan(load, raw, config.insured_share, config.burst_room)
        return BurstBlindPlanner(tidal, base, held, ahead)
    fitted = hindsight_fitted(samples, step, config.hindsight_quantile, config.policy)
    return HindsightPlanner(
        tidal,
        fitted,
        config.hindsight_room,
        ahead,
        tidal_lend=tidal_lend,
        keeps_cooldown=keeps_cooldown,
    )
