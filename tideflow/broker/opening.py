"""Opening a broker: its load, actuator, policy configuration and journal, from its
settings (``tideflow.broker.settings``) and the node sizes.

Every setting is checked before any state is opened; a refusal names the
variables behind it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tideflow.broker.actuator import TenantActuator
from tideflow.broker.journal import DecisionJournal
from tideflow.broker.load import LoadSample, LoadSource, ServingSignal
from tideflow.broker.local import LocalActuator
from tideflow.broker.node_size import local_node_gpus, node_gpus
from tideflow.broker.policy import PolicyConfig
from tideflow.broker.settings import BrokerSettings, latency_source_from, load_source_from
from tideflow.config import ConfigError, bad_setting


@dataclass(frozen=True)
class ServedLoad:
    """The load, with the serving side's latency signal beside it and the signal's limit
    (the SLO): the broker then learns its per-GPU throughput (``learned_throughput``)."""

    load: LoadSource
    signal: ServingSignal
    slo: float  # the signal's limit: seconds at the percentile, or the share over target

    @property
    def window_s(self) -> float:
        return self.load.window_s

    @property
    def day_s(self) -> float:
        return float(getattr(self.load, "day_s", 86400.0))

    def samples(self, start_s: float, end_s: float) -> list[LoadSample]:
        return self.load.samples(start_s, end_s)


def day_scale(load: LoadSource) -> float:
    """How much shorter the load's day is than a real one (1: a real day)."""
    return float(getattr(load, "day_s", 86400.0)) / 86400.0


def on_the_loads_clock(config: PolicyConfig, load: LoadSource) -> PolicyConfig:
    """The policy's horizons and cooldown shortened with a compressed day, so a demo's
    broker forecasts, lends and waits as it would over a real one."""
    scale = day_scale(load)
    if scale == 1.0:
        return config
    return replace(
        config,
        lead_s=config.lead_s * scale,
        lend_horizon_s=config.lend_horizon_s * scale,
        cooldown_s=config.cooldown_s * scale,
        # the budget's week shrinks with the day: so does what it charges for a stop
        stop_cost_s=config.stop_cost_s * scale,
    )


def served(settings: BrokerSettings, load: LoadSource) -> LoadSource:
    """The load, with the latency source beside it when one is set."""
    if not settings.latency:
        return load
    if not (settings.latency_slo_s > 0) ^ (settings.latency_slo_share > 0):
        raise ConfigError(
            f"latency {settings.latency!r} needs exactly one of "
            "latency_slo_s (TIDEFLOW_BROKER_LATENCY_SLO_S) or latency_slo_share "
            "(TIDEFLOW_BROKER_LATENCY_SLO_SHARE) > 0"
        )
    signal = latency_source_from(settings.latency, load.window_s, settings.latency_slo_s)
    return ServedLoad(load, signal, settings.latency_slo)


def policy_config(
    settings: BrokerSettings, total_gpus: int, node: int | None = None
) -> PolicyConfig:
    """The policy's configuration from the settings, with ``node`` GPUs per node (the
    settings' own when not given, else the policy's default); every other default is the
    policy's own."""
    return PolicyConfig(
        total_gpus=total_gpus,
        per_gpu_rps=settings.per_gpu_rps,
        node_gpus=node or settings.node_gpus or PolicyConfig.node_gpus,
        min_inference_gpus=settings.min_inference_gpus,
        checkpoint_grace_s=settings.grace_s,
        lost_work_budget=settings.lost_work_budget,
        stop_cost_s=settings.stop_cost_s,
    )


def within_inference_quota(
    config: PolicyConfig, actuator: TenantActuator, settings: BrokerSettings
) -> PolicyConfig:
    """The policy's bounds when the broker is inference's tenant (``tideflow.broker.tenant``).

    The decision then moves within inference's declared nominal quota in whole nodes
    (of ``config.node_gpus``), and never below what the actuator keeps anyway
    (``least_gpus``: on a cluster, the part of the quota inference's rules let nobody
    borrow), so that the journal records what is held rather than a number the
    actuator would correct.
    """
    if not actuator.tenant:
        return config
    node = config.node_gpus
    most = actuator.capacity() // node * node
    if most == 0:
        # A quota declared only for another model, or below one node, would cap the
        # broker at nothing and hand every inference node to training.
        raise ConfigError(
            f"tideflow broker: team inference's {settings.device_class} quota in the "
            f"cluster file holds no whole node of {node} GPU(s) for the devices the broker "
            f"moves (quota {actuator.capacity()}); declare inference a quota of at least "
            f"{node} for the class, or for the model of the pool's nodes"
        )
    if most < settings.min_inference_gpus:
        raise ConfigError(
            f"tideflow broker: team inference's {settings.device_class} quota in the "
            f"cluster file holds {most} GPU(s) in whole nodes of {node}, below the "
            f"broker's min_inference_gpus {settings.min_inference_gpus} "
            "(TIDEFLOW_BROKER_MIN_INFERENCE_GPUS)"
        )
    least = min(most, -(-actuator.least_gpus() // node) * node)
    return replace(
        config,
        max_inference_gpus=most,
        min_inference_gpus=max(config.min_inference_gpus, least),
    )


def checked_policy(settings: BrokerSettings, total: int, node: int) -> PolicyConfig:
    """``policy_config``, its refusals ``ConfigError`` naming the variables behind them."""
    if settings.min_inference_gpus > total:
        raise bad_setting(
            "TIDEFLOW_BROKER_MIN_INFERENCE_GPUS",
            str(settings.min_inference_gpus),
            f"a whole number within 0..{total}",
            f"the broker moves {total} {settings.device_class} devices",
        )
    try:
        return policy_config(settings, total, node)
    except ValueError as exc:  # a node size that does not divide the total, say
        raise ConfigError(f"{exc} (from TIDEFLOW_BROKER_* and the nodes)") from None


def open_local(
    settings: BrokerSettings, ledger_path: Path, journal_path: Path, cluster_file: str | None
) -> tuple[LoadSource, LocalActuator, PolicyConfig, DecisionJournal]:
    """The pieces of a local broker, from its settings and the shared state files.

    Every setting is checked before the ledger and the journal are opened (created):
    one the broker cannot use (``ConfigError``) leaves no state behind."""
    from types import SimpleNamespace

    from tideflow.backends.local import LocalBackend
    from tideflow.inventory import inventory_for
    from tideflow.scheduling import LeaseLedger
    from tideflow.scheduling.quota import Teams
    from tideflow.spec import SpecError

    try:
        inventory = inventory_for(cluster_file)
    except SpecError as exc:  # located in the file; the setting that named it, named too
        text = str(exc.issues[0]) if len(exc.issues) == 1 else str(exc)
        raise ConfigError(f"TIDEFLOW_CLUSTER_FILE={cluster_file!r}: {text}") from None
    node = local_node_gpus(inventory, cluster_file, settings)
    load = served(settings, load_source_from(settings.load))
    total = sum(n.devices for n in inventory.nodes if n.device_class == settings.device_class)
    config = on_the_loads_clock(checked_policy(settings, total, node), load)

    def actuator_on(ledger: Any, backend: LocalBackend | None) -> LocalActuator:
        return LocalActuator(
            ledger,
            backend,
            node_gpus=node,
            device_class=settings.device_class,
            grace_s=settings.grace_s,
            checkpoint_store=backend.checkpoint_store if backend else None,
        )

    # inference's quota, read from the inventory alone: what the ledger would say of it
    unopened = SimpleNamespace(inventory=inventory, teams=Teams.of(inventory))
    config = within_inference_quota(config, actuator_on(unopened, None), settings)
    ledger_path.parent.mkdir(parents=True, exist_ok=True)
    actuator = actuator_on(
        LeaseLedger(ledger_path, inventory), LocalBackend(ledger_path.parent / "gangs")
    )
    return load, actuator, config, DecisionJournal(journal_path)


def open_kubernetes(
    settings: BrokerSettings, journal_path: Path, api_client: Any
) -> tuple[LoadSource, Any, PolicyConfig, DecisionJournal]:
    """The pieces of a broker acting on a cluster (``tideflow.broker.kubernetes``), the
    objects it moves named by ``TIDEFLOW_K8S_*`` and its teams by ``TIDEFLOW_CLUSTER_FILE``.
    Its node size is ``TIDEFLOW_BROKER_NODE_GPUS`` when set, else the GPU nodes' own."""
    from tideflow.broker.kubernetes import KubernetesActuator, target_from_env

    actuator = KubernetesActuator(
        api_client, target_from_env(), grace_s=settings.grace_s, node_gpus=settings.node_gpus
    )
    if actuator.node_gpus is None:
        actuator.node_gpus = _cluster_node_gpus(actuator)
    load = served(settings, load_source_from(settings.load))
    config = on_the_loads_clock(
        checked_policy(settings, actuator.total_gpus(), actuator.node_gpus), load
    )
    config = within_inference_quota(config, actuator, settings)
    return load, actuator, config, DecisionJournal(journal_path)


def _cluster_node_gpus(actuator: Any) -> int:
    """The size of the cluster's GPU nodes, from their allocatable GPUs."""
    target = actuator.target
    sizes = actuator.node_sizes()
    if not sizes:
        raise bad_setting(
            "TIDEFLOW_K8S_NODE_SELECTOR",
            target.node_selector,
            "a label selector matching the GPU nodes",
            f"no node it selects has allocatable {target.gpu_resource}",
        )
    where = f"the cluster ({target.node_selector})"
    return node_gpus(sizes, None, actuator.device_class, where)
