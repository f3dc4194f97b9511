"""The broker's settings: what load it follows and how far it may move GPUs."""

from __future__ import annotations

from tideflow.settings_registry.model import Reader, Setting

DEVICE_CLASSES = ("gpu", "npu")
LOAD_FORMS = "trace:PATH.csv, prometheus:URL|QUERY or synthetic:MEAN_RPS[@PERIOD_S]"
LATENCY_FORMS = "prometheus:URL|QUERY or synthetic:CAPACITY_RPS"
BROKER: tuple[Reader, ...] = ("broker", "cli", "dag", "operator")

BROKER_SETTINGS = (
    Setting(
        "TIDEFLOW_BROKER_LOAD",
        "form",
        BROKER,
        "The inference load the broker follows; unset, there is no broker.",
        LOAD_FORMS,
        default_note="none: no broker",
    ),
    Setting(
        "TIDEFLOW_BROKER_PER_GPU_RPS",
        "number",
        BROKER,
        "Requests/s one inference GPU serves within its latency SLO (needed with a load).",
        "a number > 0 (the requests/s one inference GPU serves within its latency SLO)",
        above=0,
        default_note="none: required with TIDEFLOW_BROKER_LOAD",
    ),
    Setting(
        "TIDEFLOW_BROKER_NODE_GPUS",
        "whole",
        BROKER,
        "GPUs per node it moves; must be one of the nodes' sizes.",
        "a whole number >= 1",
        minimum=1,
        default_note="the nodes' own size (cluster file; nodes' allocatable GPUs)",
    ),
    Setting(
        "TIDEFLOW_BROKER_DEVICE_CLASS",
        "choice",
        BROKER,
        "The device class it moves between inference and training.",
        ", ".join(DEVICE_CLASSES),
        default="gpu",
        choices=DEVICE_CLASSES,
    ),
    Setting(
        "TIDEFLOW_BROKER_MIN_INFERENCE_GPUS",
        "whole",
        BROKER,
        "GPUs inference keeps whatever the load.",
        "a whole number >= 0",
        default="0",
        minimum=0,
    ),
    Setting(
        "TIDEFLOW_BROKER_GRACE_S",
        "number",
        BROKER,
        "Seconds a reclaimed gang has to checkpoint before it is evicted.",
        "seconds >= 0",
        default="300",
        minimum=0,
    ),
    Setting(
        "TIDEFLOW_BROKER_STOP_COST_S",
        "number",
        BROKER,
        "Seconds one stopped GPU costs (its checkpoint on notice and restart).",
        "seconds >= 0",
        default="360",
        minimum=0,
    ),
    Setting(
        "TIDEFLOW_BROKER_LOST_WORK_BUDGET",
        "form",
        BROKER,
        "Share of training GPU-time stops may cost ('none': a fixed lend bound).",
        "a share of training GPU-time within (0, 1), e.g. 0.01, or 'none' for a fixed lend bound",
        default="0.01",
    ),
    Setting(
        "TIDEFLOW_BROKER_LATENCY",
        "form",
        BROKER,
        "A latency source to learn the per-GPU throughput from (with one SLO below).",
        LATENCY_FORMS,
        default_note="none: the configured per-GPU throughput",
    ),
    Setting(
        "TIDEFLOW_BROKER_LATENCY_SLO_S",
        "number",
        BROKER,
        "The latency SLO in seconds (the source gives seconds at its percentile).",
        "seconds > 0",
        above=0,
        blank_is_unset=True,
        default_note="none",
    ),
    Setting(
        "TIDEFLOW_BROKER_LATENCY_SLO_SHARE",
        "number",
        BROKER,
        "The SLO as the share of requests over the latency target.",
        "a share within (0, 1)",
        above=0,
        below=1,
        blank_is_unset=True,
        default_note="none",
    ),
    Setting(
        "TIDEFLOW_BROKER_SENSE_S",
        "number",
        ("dag",),
        "Seconds one broker DAG run's sensor waits for a reason to act.",
        "seconds > 0",
        default="240",
        above=0,
    ),
    Setting(
        "TIDEFLOW_BROKER_POLL_S",
        "number",
        ("dag",),
        "Seconds between the broker sensor's looks at the load.",
        "seconds > 0",
        default="30",
        above=0,
    ),
)
