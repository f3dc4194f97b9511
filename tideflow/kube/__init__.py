"""Kubernetes objects tideflow generates (pure functions of a compiled plan)."""

from tideflow.kube.jobset import jobset
from tideflow.kube.names import dns_label
from tideflow.kube.volcano import KubeSettings, volcano_job

__all__ = ["KubeSettings", "dns_label", "jobset", "volcano_job"]
