"""The cluster's objects: where gang steps go, and what the broker moves."""

from __future__ import annotations

from dataclasses import replace

from tideflow.settings_registry.model import Setting
from tideflow.version import __version__

# The image a release publishes, tagged with the package version (deploy/ names it too;
# tests/kube/test_image_tag.py keeps them equal).
DEFAULT_IMAGE = f"registry.example.com/tideflow:{__version__}"

QUEUE_KINDS = ("volcano", "kueue")
SERVICE_ACCOUNT = (
    "a ServiceAccount name (lowercase letters, digits, '-' and '.', at most 253 characters)"
)


def _account(name: str, default: str, what: str) -> Setting:
    return Setting(name, "text", ("operator", "cli"), what, SERVICE_ACCOUNT, default=default)


def _broker(name: str, help_: str, default: str | None = None, note: str = "") -> Setting:
    return Setting(name, "text", ("broker",), help_, "a name", default=default, default_note=note)


_DECLARED = (
    Setting(
        "TIDEFLOW_K8S_CONN_ID",
        "text",
        ("operator",),
        "The Airflow connection (cncf.kubernetes provider) operators reach the cluster by.",
        "an Airflow connection id",
        default_note="none: in-cluster config, else $KUBECONFIG",
    ),
    Setting(
        "TIDEFLOW_K8S_NAMESPACE",
        "text",
        ("operator", "cli", "broker"),
        "The namespace of gang jobs and of what the broker moves.",
        "a namespace name",
        default="tideflow",
        nonblank=True,
    ),
    Setting(
        "TIDEFLOW_K8S_IMAGE",
        "text",
        ("operator", "cli"),
        "The image gang workers run, unless a pipeline names its own.",
        "an image reference",
        default=DEFAULT_IMAGE,
        nonblank=True,
    ),
    Setting(
        "TIDEFLOW_K8S_STORE_SECRET",
        "text",
        ("operator", "cli"),
        "The Secret with the object store's credentials (empty: the pod's identity, IRSA).",
        "a Secret name, or empty",
        default="tideflow-store",
    ),
    Setting(
        "TIDEFLOW_K8S_MLFLOW_URI",
        "text",
        ("operator", "cli"),
        "The MLflow address as pods reach it.",
        "an MLflow tracking URI",
        default_note="MLFLOW_TRACKING_URI, else http://mlflow.tideflow:5000",
        blank_is_unset=True,
    ),
    Setting(
        "TIDEFLOW_K8S_GANG_SCHEDULER",
        "choice",
        ("operator", "cli"),
        "The gang scheduler: a Volcano Job, or a JobSet admitted by Kueue.",
        ", ".join(QUEUE_KINDS),
        default="volcano",
        choices=QUEUE_KINDS,
    ),
    Setting(
        "TIDEFLOW_K8S_GRACE_S",
        "whole",
        ("operator", "cli"),
        "terminationGracePeriodSeconds of gang pods: the time to checkpoint after SIGTERM.",
        "whole seconds >= 30 (the time a worker has to write a checkpoint after SIGTERM)",
        default="300",
        minimum=30,
    ),
    Setting(
        "TIDEFLOW_K8S_DEVICE_MODELS",
        "form",
        ("operator", "cli"),
        "Device model -> node label value (replaces the built-in GPU product table).",
        "MODEL=NODE_LABEL_VALUE pairs separated by commas (e.g. H100=NVIDIA-H100-80GB-HBM3)",
        default_note="the built-in GPU product table",
    ),
    _account("TIDEFLOW_K8S_GANG_SERVICE_ACCOUNT", "tideflow-gang", "Gang pods' ServiceAccount."),
    _account(
        "TIDEFLOW_K8S_ARGO_SERVICE_ACCOUNT",
        "tideflow-argo-workflow",
        "Argo workflow pods' ServiceAccount.",
    ),
    _account(
        "TIDEFLOW_K8S_ARGO_EXECUTOR_SERVICE_ACCOUNT",
        "tideflow-argo-executor",
        "The Argo executor's ServiceAccount.",
    ),
    _account(
        "TIDEFLOW_K8S_ARGO_GANG_DRIVER_SERVICE_ACCOUNT",
        "tideflow-argo-gang-driver",
        "The Argo gang driver pod's ServiceAccount.",
    ),
    Setting(
        "TIDEFLOW_K8S_QUEUE_KIND",
        "choice",
        ("broker",),
        "The kind of training queue the broker resizes.",
        ", ".join(QUEUE_KINDS),
        default="volcano",
        choices=QUEUE_KINDS,
    ),
    Setting(
        "TIDEFLOW_K8S_GPUS_PER_REPLICA",
        "whole",
        ("broker",),
        "GPUs one inference replica holds.",
        "a whole number >= 1",
        default="1",
        minimum=1,
    ),
    _broker("TIDEFLOW_K8S_INFERENCE_DEPLOYMENT", "The inference Deployment.", "inference"),
    _broker("TIDEFLOW_K8S_INFERENCE_HPA", "The inference HPA, when one scales it.", note="none"),
    _broker("TIDEFLOW_K8S_GPU_RESOURCE", "The GPU's resource name.", "nvidia.com/gpu"),
    _broker("TIDEFLOW_K8S_NODE_SELECTOR", "The GPU nodes' label.", "nvidia.com/gpu.present=true"),
    _broker(
        "TIDEFLOW_K8S_TRAINING_QUEUE",
        "The training queue (Volcano Queue or Kueue ClusterQueue) it resizes.",
        "training",
    ),
    _broker(
        "TIDEFLOW_K8S_KUEUE_FLAVOR", "The ResourceFlavor whose quota moves (Kueue).", note="none"
    ),
)

# Read where gang steps (or the broker, ``--backend kubernetes``) act on a cluster.
KUBERNETES = tuple(replace(s, backends=("kubernetes",)) for s in _DECLARED)
