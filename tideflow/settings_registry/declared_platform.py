"""Where state, pipelines, artifacts and the cluster inventory are: every front end's."""

from __future__ import annotations

from tideflow.settings_registry.model import BACKENDS, Setting

PLATFORM = (
    Setting(
        "TIDEFLOW_HOME",
        "path",
        ("cli", "operator", "dag", "worker", "broker", "stack"),
        "State of one installation: the lease ledger, the broker's journal, gang files.",
        "a directory, or a path one can be made at",
        default_note="./.tideflow (empty: the working directory; Argo pods: /tmp/tideflow)",
    ),
    Setting(
        "TIDEFLOW_BACKEND",
        "choice",
        ("cli", "operator", "dag"),
        "Where gang steps run: processes on this machine, or a Kubernetes cluster.",
        ", ".join(BACKENDS),
        default="local",
        choices=BACKENDS,
    ),
    Setting(
        "TIDEFLOW_PIPELINES_DIR",
        "path",
        ("cli", "dag", "stack"),
        "The pipeline files the DAG file builds one DAG each from (`tideflow run`: one file).",
        "a directory of pipeline YAML files, or one pipeline file",
        default="pipelines",
    ),
    Setting(
        "TIDEFLOW_CLUSTER_FILE",
        "path",
        ("cli", "operator", "dag", "worker", "broker", "stack"),
        "The cluster inventory (nodes, teams, quotas); every process must use the same one.",
        "a cluster file (kind: Cluster), or empty for this machine's devices",
        default_note="none: this machine's devices",
        blank_is_unset=True,
    ),
    Setting(
        "TIDEFLOW_ARTIFACT_ROOT",
        "uri",
        ("cli", "operator", "dag"),
        "Where step outputs and checkpoints go (file:// or s3:// URI).",
        "a store URI (file:///path or s3://bucket/prefix)",
        kubernetes="s3://tideflow/artifacts",
        default_note="file://$TIDEFLOW_HOME/artifacts",
    ),
    Setting(
        "TIDEFLOW_CHECKPOINT_ROOTS",
        "form",
        ("cli", "operator", "dag"),
        "Store roots besides the artifact root that checkpoints may go under, per team.",
        "comma-separated URIs, each URI or TEAM=URI (e.g. s3://shared/ckpt,vision=s3://v/ckpt)",
        default="",
    ),
    Setting(
        "TIDEFLOW_MLFLOW_UI_URL",
        "text",
        ("operator",),
        "The MLflow UI's address as a browser reaches it, for run links.",
        "an http:// or https:// URL",
        default_note="MLFLOW_TRACKING_URI when it is http(s)",
    ),
    Setting(
        "TIDEFLOW_PROMOTION_CLAIM_TTL_S",
        "number",
        ("operator",),
        "Seconds a registration claim stands without its version before another takes over.",
        "seconds > 0",
        default="600",
        above=0,
    ),
    Setting(
        "TIDEFLOW_CLUSTER_CACHE",
        "path",
        ("stack",),
        "Where `make cluster` keeps the binaries and images it builds once per version.",
        "a directory",
        default_note="$XDG_CACHE_HOME/tideflow/cluster",
    ),
)
