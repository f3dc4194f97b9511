"""The GPU nodes the broker manages, their pools, and the GPUs the pods on them hold.

Nodes move between the ``inference`` and ``training`` pools as a whole: a label
(``tideflow.io/pool=POOL``) that pods select, and a ``NoSchedule`` taint of the
same key and value that keeps pods of no pool off.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC
from typing import Any

from tideflow.broker.kube_target import TAINT_KEY, ClusterTarget
from tideflow.broker.snapshot import GangView
from tideflow.checkpoint import CHECKPOINT_URI_ENV
from tideflow.checkpoint.recency import work_at_risk_since
from tideflow.compile.cluster_names import POOL_LABEL
from tideflow.kube.client import MERGE, on_conflict_read_again
from tideflow.kube.names import dns_label
from tideflow.steps.context import GANG_LABEL, TEAM_LABEL


def checkpoint_store(pods: list[Any]) -> str | None:
    """The checkpoint store a gang's pods were given (the same for all of its workers)."""
    for pod in pods:
        for container in pod.spec.containers or []:
            for variable in container.env or []:
                if variable.name == CHECKPOINT_URI_ENV and variable.value:
                    return str(variable.value)
    return None


def taint_as_written(taint: Any) -> dict[str, str]:
    """A taint as the API server wrote it: its set fields, timeAdded in RFC 3339 UTC.

    timeAdded (set on NoExecute taints) starts their toleration time: dropping it
    would change the taint.
    """
    found = {"key": taint.key, "value": taint.value, "effect": taint.effect}
    added = getattr(taint, "time_added", None)
    if added is not None:
        found["timeAdded"] = added.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {name: value for name, value in found.items() if value}


def by_gang(pods: list[Any]) -> dict[str, list[Any]]:
    """Pods by their ``tideflow.io/gang`` label (pods without one are no gang's)."""
    found: dict[str, list[Any]] = {}
    for pod in pods:
        gang = (pod.metadata.labels or {}).get(GANG_LABEL)
        if gang:
            found.setdefault(gang, []).append(pod)
    return found


def spec_gpus(spec: dict[str, Any], resource: str) -> int:
    """GPUs a pod with this spec holds, by the Kubernetes rule for a pod's effective
    request: its containers' sum plus its sidecars' (init containers with
    ``restartPolicy: Always``, running beside them), or, if higher, the most any
    other init container holds with the sidecars started before it."""
    sidecars = init_peak = 0
    for container in spec.get("initContainers") or []:
        if container.get("restartPolicy") == "Always":
            sidecars += container_gpus(container, resource)
        else:
            init_peak = max(init_peak, sidecars + container_gpus(container, resource))
    app = sum(container_gpus(c, resource) for c in spec.get("containers") or [])
    return max(app + sidecars, init_peak)


def container_gpus(container: dict[str, Any], resource: str) -> int:
    """GPUs a container asks for (its requests, else its limits: an extended
    resource's request defaults to its limit)."""
    resources = container.get("resources") or {}
    amount = (resources.get("requests") or {}).get(resource)
    if amount is None:
        amount = (resources.get("limits") or {}).get(resource, "0")
    return int(str(amount))


class NodePools:
    """The GPU nodes (``ClusterTarget.node_selector``), the pool each is in, the pods
    on the training pool, and moving a node from one pool to the other."""

    def __init__(self, core: Any, target: ClusterTarget) -> None:
        self.core = core
        self.target = target
        self._read: dict[str, list[Any]] | None = None  # inside ``reading``: what was listed

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Inside it, the nodes and the training pool's pods are listed once: one view of
        the cluster for a whole observation, and two API calls instead of one per
        question asked of it."""
        self._read = {}
        try:
            yield
        finally:
            self._read = None

    def _listed(self, what: str, read: Callable[[], list[Any]]) -> list[Any]:
        if self._read is None:
            return read()
        if what not in self._read:
            self._read[what] = read()
        return self._read[what]

    def gpu_nodes(self) -> list[Any]:
        return self._listed("nodes", self._list_gpu_nodes)

    def _list_gpu_nodes(self) -> list[Any]:
        nodes = self.core.list_node(label_selector=self.target.node_selector).items
        return sorted(nodes, key=lambda n: n.metadata.name)

    def gpus(self, node: Any) -> int:
        return int(str((node.status.allocatable or {}).get(self.target.gpu_resource, "0")))

    @staticmethod
    def pool(node: Any) -> str:
        return str((node.metadata.labels or {}).get(POOL_LABEL, "training"))

    def spec_gpus(self, spec: dict[str, Any]) -> int:
        return spec_gpus(spec, self.target.gpu_resource)

    def pod_gpus(self, pod: Any) -> int:
        """GPUs a pod holds: the scheduler reserves its effective request for its life."""
        serialize = self.core.api_client.sanitize_for_serialization
        return self.spec_gpus(
            {
                "containers": serialize(pod.spec.containers or []),
                "initContainers": serialize(pod.spec.init_containers or []),
            }
        )

    def gangs(self, pods: list[Any], teams: Iterable[str] = ()) -> tuple[GangView, ...]:
        """The gangs of ``pods`` by their ``tideflow.io/gang`` label, each with the team of
        ``teams`` its pods' team label names (None: no label, or a team not in ``teams``).

        The work at risk runs from the gang's newest committed checkpoint, read from the
        store its pods are given (``TIDEFLOW_CHECKPOINT_URI``; the broker needs read access
        to it), or from its pods' start when there is none or the store cannot be read.
        """
        by_label = {dns_label(team): team for team in teams}
        views = []
        for gang, mine in sorted(by_gang(pods).items()):
            starts = [p.status.start_time.timestamp() for p in mine if p.status.start_time]
            started = min(starts, default=0.0)
            label = (mine[0].metadata.labels or {}).get(TEAM_LABEL)
            views.append(
                GangView(
                    gang,
                    sum(self.pod_gpus(p) for p in mine),
                    min(int(p.spec.priority or 0) for p in mine),
                    work_at_risk_since(started, checkpoint_store(mine)),
                    nodes=tuple(sorted({p.spec.node_name for p in mine if p.spec.node_name})),
                    team=by_label.get(label) if label else None,
                    started_s=started,
                )
            )
        return tuple(views)

    def training_pods(self) -> list[Any]:
        return self._listed("pods", self._list_training_pods)

    def _list_training_pods(self) -> list[Any]:
        training = {n.metadata.name for n in self.gpu_nodes() if self.pool(n) != "inference"}
        pods = self.core.list_namespaced_pod(self.target.namespace).items
        return [
            p
            for p in pods
            if p.spec.node_name in training
            and p.status.phase in ("Pending", "Running")
            and p.metadata.deletion_timestamp is None
        ]

    def busy_nodes(self) -> set[str]:
        """Training nodes inference cannot take now: a live pod runs on them (an evicted
        one, terminating, no longer counts), or they are cordoned or not Ready."""
        return {p.spec.node_name for p in self.training_pods()} | self.unusable_nodes()

    def unusable_nodes(self) -> set[str]:
        """GPU nodes cordoned (drained for maintenance) or not Ready: inference's replicas
        would not start there, so the broker neither counts nor takes them."""
        unusable = set()
        for node in self.gpu_nodes():
            conditions = (node.status.conditions or []) if node.status else []
            not_ready = any(c.type == "Ready" and c.status != "True" for c in conditions)
            if node.spec.unschedulable or not_ready:
                unusable.add(node.metadata.name)
        return unusable

    def set_pool(self, node: Any, pool: str) -> None:
        """Label and taint ``node`` as ``pool``'s, keeping every other taint it has.

        The taint list is sent back whole, so the patch carries the resourceVersion
        it was read at: any change since (a taint a GPU health check or the node
        lifecycle controller added, a status update) makes it a 409 Conflict and the
        node is read again. A taint added meanwhile is kept, not dropped, and
        deploy/kubernetes/broker-rbac.yaml's policy does not refuse the patch.
        """
        on_conflict_read_again(lambda: self._patch_pool(node.metadata.name, pool))

    def _patch_pool(self, name: str, pool: str) -> None:
        node = self.core.read_node(name)
        taints = [t for t in (node.spec.taints or []) if getattr(t, "key", None) != TAINT_KEY]
        body = {
            "metadata": {
                "labels": {POOL_LABEL: pool},
                "resourceVersion": node.metadata.resource_version,
            },
            "spec": {
                "taints": [taint_as_written(t) for t in taints]
                # Pods that are no pool's stay off; a pool's pods tolerate the key and
                # choose their pool by the label (tideflow.kube.pods).
                + [{"key": TAINT_KEY, "value": pool, "effect": "NoSchedule"}]
            },
        }
        self.core.patch_node(name, body, _content_type=MERGE)
