"""What the commands read from the environment: the platform settings and the cluster
inventory, each checked before a command opens any state."""

from __future__ import annotations

from tideflow.config import Settings
from tideflow.inventory import Inventory, cluster_setting, load_cluster


def checked_settings() -> Settings:
    """The platform settings, the cluster file they name loaded and checked: one they
    cannot use is a ``ConfigError`` (exit 2) naming the setting, before any state opens."""
    settings = Settings.from_env()
    if settings.cluster_file is not None:
        cluster_setting(settings.cluster_file)
    return settings


def cluster_inventory(path: str | None) -> Inventory | None:
    """The cluster file named on the command line, else the one the settings name."""
    if path:  # a file named on the command line: its problems are the file's (exit 1)
        return load_cluster(path)
    settings = Settings.from_env()
    return cluster_setting(settings.cluster_file) if settings.cluster_file else None
