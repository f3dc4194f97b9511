"""Kubernetes objects tideflow generates: gang objects, pods, names (pure functions)."""

from tideflow.kube.names import dns_label
from tideflow.kube.settings import KubeSettings

__all__ = ["KubeSettings", "dns_label"]
