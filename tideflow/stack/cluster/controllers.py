"""Kueue, JobSet and kwok as processes on 127.0.0.1, beside the control plane.

Each runs with the admin kubeconfig (they are upstream's controllers, not ours:
tideflow's own ServiceAccounts are what the RBAC tests hold to account), leader
election off, webhooks served on a loopback port with a certificate from the
local CA, metrics off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tideflow.stack.cluster import pki
from tideflow.stack.cluster.build import CLUSTER_DIR, COMPONENTS, Component
from tideflow.stack.cluster.control_plane import launch
from tideflow.stack.cluster.kubeapi import Kube
from tideflow.stack.cluster.manifests import (
    KUEUE_CONVERTED,
    KUEUE_GROUPS,
    crds,
    documents,
    jobset_pod_selector,
    module_dir,
    touches_only,
    webhooks,
)
from tideflow.stack.cluster.nodes import KWOK_LABEL
from tideflow.stack.cluster.state import ClusterState
from tideflow.stack.processes import StackError, free_port

KUEUE_NAMESPACE = "kueue-system"
# Kueue v0.17 reads its metrics server's certificate from this fixed path whenever its
# own certificate management is off (cmd/kueue/main.go), even with metrics disabled.
KUEUE_METRICS_CERTS = Path("/etc/kueue/metrics/certs")
KUEUE_FRAMEWORKS = ("batch/job", "jobset.x-k8s.io/jobset")


def component(name: str) -> Component:
    return next(c for c in COMPONENTS if c.name == name)


def _webhook_certs(state: ClusterState, name: str) -> tuple[Path, bytes]:
    """A cert dir holding tls.crt and tls.key (controller-runtime's names) for 127.0.0.1."""
    home = Path(state.home) / "pki"
    folder = home / f"{name}-webhook"
    folder.mkdir(parents=True, exist_ok=True)
    authority = pki.ca(home)
    pki.issue(folder, authority, "tls", common=f"{name}-webhook", server=True)
    return folder, authority.cert.read_bytes()


def _run(state: ClusterState, name: str, command: list[str], health_port: int, port: int) -> None:
    health = f"http://127.0.0.1:{health_port}/readyz"
    launch(state, name, command, health=health, context=None, port=port)


def _controller_config(api_version: str, port: int, health: int, certs: Path) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(certs)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
    }


def _kueue_metrics_certs(state: ClusterState) -> None:
    """A certificate pair at Kueue's fixed metrics path, written once if none is there."""
    if (KUEUE_METRICS_CERTS / "tls.crt").exists():
        return
    try:
        KUEUE_METRICS_CERTS.mkdir(parents=True, exist_ok=True)
        pki.issue(
            KUEUE_METRICS_CERTS,
            pki.ca(Path(state.home) / "pki"),
            "tls",
            common="kueue-metrics",
            server=True,
        )
    except OSError as exc:
        raise StackError(
            f"Kueue needs a certificate at {KUEUE_METRICS_CERTS} (a fixed path in v0.17), "
            f"which cannot be written: {exc}"
        ) from exc


def start_kueue(state: ClusterState, kube: Kube, binaries: Path) -> None:
    source = module_dir(component("kueue"))
    _kueue_metrics_certs(state)
    certs, ca = _webhook_certs(state, "kueue")
    port, health = free_port(), free_port()
    url = f"https://127.0.0.1:{port}"
    kube.apply(crds(source, KUEUE_CONVERTED, url, ca))
    kube.wait_crds_established()
    kube.ensure_namespace(KUEUE_NAMESPACE)
    config = _controller_config("config.kueue.x-k8s.io/v1beta2", port, health, certs)
    config.update(
        namespace=KUEUE_NAMESPACE,
        manageJobsWithoutQueueName=False,
        integrations={"frameworks": list(KUEUE_FRAMEWORKS)},
        # its aggregated visibility API would need an APIService routed to this machine
        featureGates={"VisibilityOnDemand": False},
    )
    path = Path(state.home) / "kueue-config.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [str(binaries / "kueue"), f"--config={path}", f"--kubeconfig={state.admin}"]
    _run(state, "kueue", command, health, port)
    kube.apply(webhooks(source, "kueue", url=url, ca=ca, keep=touches_only(KUEUE_GROUPS)))


def start_jobset(state: ClusterState, kube: Kube, binaries: Path) -> None:
    source = module_dir(component("jobset"))
    certs, ca = _webhook_certs(state, "jobset")
    port, health = free_port(), free_port()
    url = f"https://127.0.0.1:{port}"
    kube.apply(crds(source, (), url, ca))
    kube.wait_crds_established()
    config = _controller_config("config.jobset.x-k8s.io/v1alpha1", port, health, certs)
    path = Path(state.home) / "jobset-config.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [str(binaries / "jobset"), f"--config={path}", f"--kubeconfig={state.admin}"]
    _run(state, "jobset", command, health, port)
    kube.apply(webhooks(source, "jobset", url=url, ca=ca, adjust=jobset_pod_selector))


def start_kwok(state: ClusterState, binaries: Path) -> None:
    """kwok with kwok's fast node and pod stages, and ours for a Job's pod ending."""
    stages = module_dir(component("kwok")) / "kustomize" / "stage"
    documents_ = [
        {
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "kind": "KwokConfiguration",
            "options": {
                "manageAllNodes": False,
                "manageNodesWithLabelSelector": "=".join(KWOK_LABEL),
                "nodeIP": "127.0.0.1",
                "nodeLeaseDurationSeconds": 40,
                # a config file's options get no defaults: kwok refuses zero workers
                "cidr": "10.0.0.1/16",
                "podPlayStageParallelism": 4,
                "nodePlayStageParallelism": 4,
                "nodeLeaseParallelism": 4,
                "podsOnNodeSyncParallelism": 4,
            },
        },
        *documents(stages / "node" / "fast" / "node-initialize.yaml"),
        *documents(stages / "pod" / "fast" / "pod-ready.yaml"),
        *documents(stages / "pod" / "fast" / "pod-delete.yaml"),
        *documents(CLUSTER_DIR / "kwok-pod-complete.yaml"),
    ]
    path = Path(state.home) / "kwok-config.yaml"
    path.write_text(yaml.safe_dump_all(documents_))
    health = free_port()
    command = [
        str(binaries / "kwok"),
        f"--config={path}",
        f"--kubeconfig={state.admin}",
        f"--server-address=127.0.0.1:{health}",
    ]
    health_url = f"http://127.0.0.1:{health}/healthz"
    launch(state, "kwok", command, health=health_url, context=None, port=health)
