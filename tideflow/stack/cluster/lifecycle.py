"""Bring the local Kubernetes cluster up and down (``make cluster`` / ``make cluster-down``)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from tideflow.inventory import ClusterSpec
from tideflow.spec.loader import load_model
from tideflow.stack.cluster import control_plane, controllers
from tideflow.stack.cluster.build import build_all
from tideflow.stack.cluster.kubeapi import Kube
from tideflow.stack.cluster.nodes import cluster_nodes
from tideflow.stack.cluster.state import ClusterState
from tideflow.stack.processes import StackError, group_alive, stop_group
from tideflow.stack.services import REPO, private_dir

DEFAULT_NODES = REPO / "deploy" / "local" / "lab-cluster.yaml"
START_ATTEMPTS = 2


def running(home: Path) -> ClusterState | None:
    state = ClusterState.load(home)
    if state is None or not state.services:
        return None
    if all(group_alive(service.pid) for service in state.services.values()):
        return state
    return None


def up(
    home: Path, cluster_file: Path = DEFAULT_NODES, say: Callable[[str], None] = print
) -> ClusterState:
    """Start the whole cluster, or return the one already running in ``home``.

    A cluster found half-running is stopped and started again from an empty
    etcd: its state is a test's, never a user's.
    """
    existing = running(home)
    if existing is not None:
        return existing
    binaries = build_all(say)
    for attempt in range(START_ATTEMPTS):
        try:
            return _start(home, cluster_file, binaries, say)
        except StackError as exc:
            # a free port picked, then taken by another process before the bind
            if attempt + 1 == START_ATTEMPTS or "address already in use" not in str(exc):
                raise
            say(f"cluster start failed ({exc.__class__.__name__}); starting again")
    raise AssertionError("unreachable")


def _start(
    home: Path, cluster_file: Path, binaries: dict[str, Path], say: Callable[[str], None]
) -> ClusterState:
    down(home)
    private_dir(home)
    shutil.rmtree(home / "etcd", ignore_errors=True)
    state = ClusterState(home=str(home))
    started = time.monotonic()
    try:
        control_plane.start_etcd(state, binaries["etcd"])
        control_plane.start_apiserver(state, binaries["kubernetes"])
        control_plane.kubeconfig(state, control_plane.ADMIN)
        control_plane.start_controller_manager(state, binaries["kubernetes"])
        control_plane.start_scheduler(state, binaries["kubernetes"])
        kube = Kube(state.admin)
        # Kueue enables its JobSet integration only when JobSet's CRD is there.
        controllers.start_jobset(state, kube, binaries["jobset"])
        controllers.start_kueue(state, kube, binaries["kueue"])
        controllers.start_kwok(state, binaries["kwok"])
        kube.create_nodes(cluster_nodes(_spec(cluster_file)))
    except BaseException:
        down(home)
        raise
    say(f"cluster up in {time.monotonic() - started:.1f}s; kubeconfig: {state.admin}")
    return state


def _spec(cluster_file: Path) -> ClusterSpec:
    return load_model(cluster_file, ClusterSpec)


def down(home: Path) -> None:
    """Stop every process of the cluster, newest first, and wait until each is gone."""
    state = ClusterState.load(home)
    if state is None:
        return
    for name in reversed(list(state.services)):
        stop_group(state.services[name].pid, grace_s=10)
    state.services = {}
    state.save()


def describe(state: ClusterState) -> str:
    lines = [f"  API server  {state.server}", f"  kubeconfig  {state.admin}"]
    for name, service in state.services.items():
        alive = "running" if group_alive(service.pid) else "stopped"
        lines.append(f"  {name:24} {alive} (log: {service.log})")
    return "\n".join(lines)
