"""etcd, kube-apiserver, kube-controller-manager and kube-scheduler on 127.0.0.1.

RBAC and Node authorization are on, ValidatingAdmissionPolicy is on (GA, on by
default), every certificate comes from ``pki``. The controller manager and the
scheduler authenticate as their own users (``system:kube-controller-manager``,
``system:kube-scheduler``), so the bootstrap RBAC roles govern them as in a
real cluster. The admin kubeconfig (``system:masters``) is ``home/kubeconfig``.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import yaml

from tideflow.stack.cluster import pki
from tideflow.stack.cluster.state import ClusterState, Service
from tideflow.stack.processes import free_port, start, wait_http

SERVICE_RANGE = "10.96.0.0/16"
START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Identity:
    """A user the control plane knows by its client certificate."""

    file: str
    user: str
    group: str | None = None


ADMIN = Identity("admin", "tideflow-admin", "system:masters")
CONTROLLER_MANAGER = Identity("controller-manager", "system:kube-controller-manager")
SCHEDULER = Identity("scheduler", "system:kube-scheduler")


def kubeconfig(state: ClusterState, who: Identity) -> Path:
    home = Path(state.home)
    authority = pki.ca(home / "pki")
    pair = pki.issue(home / "pki", authority, who.file, common=who.user, org=who.group)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "tideflow",
                "cluster": {"server": state.server, "certificate-authority": str(authority.cert)},
            }
        ],
        "users": [
            {
                "name": who.user,
                "user": {"client-certificate": str(pair.cert), "client-key": str(pair.key)},
            }
        ],
        "contexts": [{"name": "tideflow", "context": {"cluster": "tideflow", "user": who.user}}],
        "current-context": "tideflow",
    }
    path = home / ("kubeconfig" if who is ADMIN else f"{who.file}.kubeconfig")
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


def trust(home: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(pki.ca(home / "pki").cert))


def _insecure() -> ssl.SSLContext:
    # The controller manager and scheduler serve health on self-signed certs of their own.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def launch(
    state: ClusterState,
    name: str,
    command: list[str],
    *,
    health: str,
    context: ssl.SSLContext | None,
    port: int,
) -> None:
    home = Path(state.home)
    log = home / "logs" / f"{name}.log"
    pid = start(command, {"PATH": "/usr/bin:/bin", "HOME": str(home)}, log, cwd=home)
    state.services[name] = Service(pid=pid, port=port, log=str(log))
    state.save()
    wait_http(health, timeout_s=START_TIMEOUT_S, pgid=pid, log_path=log, name=name, context=context)


def start_etcd(state: ClusterState, binaries: Path) -> None:
    client, peer = free_port(), free_port()
    data = Path(state.home) / "etcd"
    data.mkdir(exist_ok=True, mode=0o700)
    command = [
        str(binaries / "etcd"),
        "--name=tideflow",
        f"--data-dir={data}",
        f"--listen-client-urls=http://127.0.0.1:{client}",
        f"--advertise-client-urls=http://127.0.0.1:{client}",
        f"--listen-peer-urls=http://127.0.0.1:{peer}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
        f"--initial-cluster=tideflow=http://127.0.0.1:{peer}",
        "--listen-metrics-urls=",
        "--log-level=warn",
        # a test cluster: losing the last writes on a crash costs nothing, fsync costs seconds
        "--unsafe-no-fsync",
    ]
    launch(
        state,
        "etcd",
        command,
        health=f"http://127.0.0.1:{client}/health",
        context=None,
        port=client,
    )


def start_apiserver(state: ClusterState, binaries: Path) -> None:
    home = Path(state.home)
    authority = pki.ca(home / "pki")
    serving = pki.issue(
        home / "pki",
        authority,
        "apiserver",
        common="kube-apiserver",
        server=True,
        dns=("kubernetes", "kubernetes.default", "kubernetes.default.svc"),
    )
    sa_key = pki.service_account_key(home / "pki")
    port = free_port()
    state.server = f"https://127.0.0.1:{port}"
    command = [
        str(binaries / "kube-apiserver"),
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--etcd-servers=http://127.0.0.1:{state.services['etcd'].port}",
        f"--tls-cert-file={serving.cert}",
        f"--tls-private-key-file={serving.key}",
        f"--client-ca-file={authority.cert}",
        f"--service-account-key-file={sa_key.cert}",
        f"--service-account-signing-key-file={sa_key.key}",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-cluster-ip-range={SERVICE_RANGE}",
        "--authorization-mode=Node,RBAC",
        f"--cert-dir={home / 'pki'}",
        # the "kubernetes" Service would point at 127.0.0.1, which Endpoints refuse
        "--endpoint-reconciler-type=none",
        "--allow-privileged=false",
    ]
    launch(
        state,
        "kube-apiserver",
        command,
        health=f"{state.server}/readyz",
        context=trust(home),
        port=port,
    )


def start_controller_manager(state: ClusterState, binaries: Path) -> None:
    home = Path(state.home)
    config = str(kubeconfig(state, CONTROLLER_MANAGER))
    authority = pki.ca(home / "pki")
    port = free_port()
    command = [
        str(binaries / "kube-controller-manager"),
        f"--kubeconfig={config}",
        f"--authentication-kubeconfig={config}",
        f"--authorization-kubeconfig={config}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={home / 'pki' / 'controller-manager'}",
        "--leader-elect=false",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki.service_account_key(home / 'pki').key}",
        f"--root-ca-file={authority.cert}",
        f"--cluster-signing-cert-file={authority.cert}",
        f"--cluster-signing-key-file={authority.key}",
    ]
    launch(
        state,
        "kube-controller-manager",
        command,
        health=f"https://127.0.0.1:{port}/healthz",
        context=_insecure(),
        port=port,
    )


def start_scheduler(state: ClusterState, binaries: Path) -> None:
    home = Path(state.home)
    config = str(kubeconfig(state, SCHEDULER))
    port = free_port()
    command = [
        str(binaries / "kube-scheduler"),
        f"--kubeconfig={config}",
        f"--authentication-kubeconfig={config}",
        f"--authorization-kubeconfig={config}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={home / 'pki' / 'scheduler'}",
        "--leader-elect=false",
    ]
    launch(
        state,
        "kube-scheduler",
        command,
        health=f"https://127.0.0.1:{port}/healthz",
        context=_insecure(),
        port=port,
    )
