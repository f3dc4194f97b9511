"""The Kubernetes actuator: the broker's decision applied to a cluster's objects.

* Nodes move between the ``inference`` and ``training`` pools as a whole: a
  label (``tideflow.io/pool=POOL``) that pods select, and a ``NoSchedule``
  taint of the same key and value that keeps pods of no pool off. Nodes are
  chosen so that the training pool keeps whole nodes.
* The inference Deployment is scaled to what its pool holds (or, when an HPA
  manages it, the HPA's bounds are moved instead of the replica count).
* The training quota follows: a Volcano Queue's ``capability`` or a Kueue
  ClusterQueue flavor's ``nominalQuota`` for the GPU resource. The Volcano queue
  is the parent of the team queues, and Volcano's queue webhook admits a change
  only while the teams' deserved, summed, stay within its ``deserved`` and that
  within its ``capability``: its ``deserved`` (the teams' sum) is the operator's,
  and the broker sets the capability to the GPUs it lends but never below that
  ``deserved`` (deploy/kubernetes/volcano-queues.yaml).
* Reclaimed gangs are evicted through the Eviction API, so PodDisruptionBudgets
  hold; each pod gets its termination grace, in which tideflow's runtime writes a
  checkpoint and exits resumable. A PDB refusal (HTTP 429) is retried until the
  broker's grace ends.
* When its cluster file (``TIDEFLOW_CLUSTER_FILE``) declares a team ``inference``,
  the broker is that team's tenant, as locally (``tideflow.broker.tenant``): it holds
  at most inference's nominal quota and lends no more of it than inference's rules
  let anyone borrow (the compiled queues lend the pool to any team); growing back,
  it stops only gangs that borrow inference's quota, read from their pods' team
  label (``tideflow.io/team``), each evicted with its rule's grace: the PDB's
  refusals are retried that long and the pods get that long to stop.

It speaks to the API server through the official ``kubernetes`` client; the
Role it needs is in ``deploy/kubernetes/broker-rbac.yaml``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tideflow.broker.journal import PreemptionCount
from tideflow.broker.policy import Decision, GangView
from tideflow.broker.tenant import (
    INFERENCE_TEAM,
    PoolGang,
    PoolNode,
    borrowers,
    capped,
    ceiling,
    floor,
    governs_inference,
    grow,
    lendable,
)
from tideflow.broker.volcano_stops import VolcanoStops
from tideflow.checkpoint import CHECKPOINT_URI_ENV
from tideflow.checkpoint.recency import work_at_risk_since
from tideflow.config import bad_setting, env_number
from tideflow.inventory import ClusterSpec, load_cluster
from tideflow.kube.client import MERGE
from tideflow.kube.names import dns_label
from tideflow.kube.volcano import GANG_LABEL, TEAM_LABEL
from tideflow.scheduling.model import DeviceClass
from tideflow.scheduling.quota import Eviction, Key, Teams

log = logging.getLogger(__name__)
POOL_LABEL = "tideflow.io/pool"
POOL = "training"  # the node label value of the broker's pool in a cluster file
DEVICE_CLASSES: dict[str, DeviceClass] = {"nvidia.com/gpu": "gpu", "huawei.com/Ascend910": "npu"}
TAINT_KEY = "tideflow.io/pool"
KUEUE_PREEMPTED = "Preempted"  # the eviction reason of a Workload Kueue preempted
QUEUE_KINDS = ("volcano", "kueue")  # the gang schedulers whose training queue it moves


@dataclass(frozen=True)
class ClusterTarget:
    namespace: str = "tideflow"
    inference_deployment: str = "inference"
    gpus_per_replica: int = 1
    hpa: str | None = None  # when set, its min/max replicas are moved, not the Deployment
    gpu_resource: str = "nvidia.com/gpu"
    node_selector: str = "nvidia.com/gpu.present=true"  # the GPU nodes the broker manages
    queue_kind: str = "volcano"  # or "kueue"
    training_queue: str = "training"  # Volcano Queue or Kueue ClusterQueue name
    kueue_flavor: str | None = None  # the ResourceFlavor whose quota moves (Kueue)
    kueue_version: str = "v1beta2"
    # The cluster file (TIDEFLOW_CLUSTER_FILE): when it declares a team ``inference``, the
    # broker keeps to that team's quota and borrowing rules (tideflow.broker.tenant).
    cluster_file: str | None = None


def target_from_env() -> ClusterTarget:
    """The cluster objects the broker moves, from ``TIDEFLOW_K8S_*`` variables
    (``ConfigError`` naming one it cannot use)."""
    import os

    env = os.environ.get
    kind = env("TIDEFLOW_K8S_QUEUE_KIND", "volcano")
    if kind not in QUEUE_KINDS:
        raise bad_setting("TIDEFLOW_K8S_QUEUE_KIND", kind, ", ".join(QUEUE_KINDS))
    return ClusterTarget(
        namespace=env("TIDEFLOW_K8S_NAMESPACE", "tideflow"),
        inference_deployment=env("TIDEFLOW_K8S_INFERENCE_DEPLOYMENT", "inference"),
        gpus_per_replica=int(
            env_number(
                "TIDEFLOW_K8S_GPUS_PER_REPLICA",
                "1",
                "a whole number >= 1",
                lambda v: v >= 1,
                whole=True,
            )
        ),
        hpa=env("TIDEFLOW_K8S_INFERENCE_HPA") or None,
        gpu_resource=env("TIDEFLOW_K8S_GPU_RESOURCE", "nvidia.com/gpu"),
        node_selector=env("TIDEFLOW_K8S_NODE_SELECTOR", "nvidia.com/gpu.present=true"),
        queue_kind=kind,
        training_queue=env("TIDEFLOW_K8S_TRAINING_QUEUE", "training"),
        kueue_flavor=env("TIDEFLOW_K8S_KUEUE_FLAVOR") or None,
        cluster_file=env("TIDEFLOW_CLUSTER_FILE") or None,
    )


def _checkpoint_store(pods: list[Any]) -> str | None:
    """The checkpoint store a gang's pods were given (the same for all of its workers)."""
    for pod in pods:
        for container in pod.spec.containers or []:
            for variable in container.env or []:
                if variable.name == CHECKPOINT_URI_ENV and variable.value:
                    return str(variable.value)
    return None


def _taint(taint: Any) -> dict[str, str]:
    """A taint as the API server wrote it: its set fields, timeAdded in RFC 3339 UTC.

    timeAdded (set on NoExecute taints) starts their toleration time: dropping it
    would change the taint.
    """
    found = {"key": taint.key, "value": taint.value, "effect": taint.effect}
    added = getattr(taint, "time_added", None)
    if added is not None:
        found["timeAdded"] = added.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {name: value for name, value in found.items() if value}


def _by_gang(pods: list[Any]) -> dict[str, list[Any]]:
    """Pods by their ``tideflow.io/gang`` label (pods without one are no gang's)."""
    found: dict[str, list[Any]] = {}
    for pod in pods:
        gang = (pod.metadata.labels or {}).get(GANG_LABEL)
        if gang:
            found.setdefault(gang, []).append(pod)
    return found


def _pool_model(spec: ClusterSpec, device_class: DeviceClass) -> str | None:
    """The device model of the broker's pool in the cluster file: of the node groups
    labelled ``tideflow.io/pool: training`` (else of every group of the class), when they
    are one model; None (the class-wide quota) otherwise."""
    groups = [
        g for g in spec.nodes if g.accelerators and g.accelerators.device_class == device_class
    ]
    pool = [g for g in groups if g.labels.get(POOL_LABEL) == POOL] or groups
    models = {g.accelerators.model for g in pool if g.accelerators}
    return models.pop() if len(models) == 1 else None


class TrainingQueueRefusedError(RuntimeError):
    """The API server refused the training queue's new quota (a webhook or the schema)."""


def _refusal(exc: Any) -> str:
    """The reason an API server gave in its Status body, or the HTTP reason."""
    try:
        return str(json.loads(exc.body)["message"])
    except (TypeError, ValueError, KeyError):
        return f"{exc.status} {exc.reason}"


@dataclass(frozen=True)
class KubernetesApplied:
    inference_gpus: int
    inference_nodes: tuple[str, ...]
    evicted_pods: tuple[str, ...]
    refused_by_pdb: tuple[str, ...]
    note: str
    stopped_gpus: int = 0  # the GPUs of the pods evicted (the journal's record of stops)


def _few(names: Sequence[str], most: int = 5) -> str:
    """Up to ``most`` names, then how many more."""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


@dataclass
class Evictions:
    """What evicting gangs did: the pods evicted and their GPUs, the pods a PDB kept
    past the deadline and the nodes they still run on."""

    evicted: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    gpus: int = 0
    kept_on: set[str] = field(default_factory=set)

    def add(self, other: Evictions) -> None:
        self.evicted += other.evicted
        self.refused += other.refused
        self.gpus += other.gpus
        self.kept_on |= other.kept_on


class KubernetesActuator:
    def __init__(
        self,
        api_client: Any,
        target: ClusterTarget,
        *,
        grace_s: float = 300.0,
        retry_s: float = 5.0,
        node_gpus: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.autoscaling = client.AutoscalingV2Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.target = target
        self.grace_s = grace_s
        self.retry_s = retry_s
        self.node_gpus = node_gpus  # GPUs per node the policy moves (None: not known)
        self.clock = clock
        self.sleep = sleep
        self.device_class = DEVICE_CLASSES.get(target.gpu_resource, "gpu")
        # Volcano's gangs carry their stops on their Jobs (tideflow.kube.volcano_lineage)
        self.volcano = (
            VolcanoStops(self.custom, target.namespace, self._spec_gpus)
            if target.queue_kind == "volcano"
            else None
        )
        self.teams: Teams | None = None  # set when the broker is inference's tenant
        self.model: str | None = None  # the pool's device model in the cluster file
        if target.cluster_file:
            inventory = load_cluster(target.cluster_file)
            teams = Teams.of(inventory)
            if governs_inference(teams) and inventory.teams is not None:
                self.teams = teams
                self.model = _pool_model(inventory.teams, self.device_class)

    @property
    def tenant(self) -> bool:
        """Whether inference is a team of the broker's cluster file."""
        return self.teams is not None

    def capacity(self) -> int:
        """The most GPUs inference may hold: its team's nominal quota when it is a
        tenant, else every GPU node the broker manages."""
        total = self.total_gpus()
        return total if self.teams is None else ceiling(self.teams, self._key(), total)

    def least_gpus(self) -> int:
        """The fewest GPUs inference keeps whatever the decision: as a tenant, the part
        of its quota that its rules let nobody borrow (the compiled queues would lend
        anything more to any team)."""
        if self.teams is None:
            return 0
        return floor(self.teams, self._key(), self.total_gpus())

    # -- reading ------------------------------------------------------------------------
    def gpu_nodes(self) -> list[Any]:
        nodes = self.core.list_node(label_selector=self.target.node_selector).items
        return sorted(nodes, key=lambda n: n.metadata.name)

    def _gpus(self, node: Any) -> int:
        return int(str((node.status.allocatable or {}).get(self.target.gpu_resource, "0")))

    def _pool(self, node: Any) -> str:
        return str((node.metadata.labels or {}).get(POOL_LABEL, "training"))

    def total_gpus(self) -> int:
        return sum(self._gpus(n) for n in self.gpu_nodes())

    def node_sizes(self) -> dict[str, int]:
        """Each selected node's allocatable GPUs, nodes with none left out."""
        return {n.metadata.name: self._gpus(n) for n in self.gpu_nodes() if self._gpus(n)}

    def inference_gpus(self) -> int:
        return sum(self._gpus(n) for n in self.gpu_nodes() if self._pool(n) == "inference")

    def _pod_gpus(self, pod: Any) -> int:
        """GPUs a pod holds: the scheduler reserves its effective request for its life."""
        serialize = self.core.api_client.sanitize_for_serialization
        return self._spec_gpus(
            {
                "containers": serialize(pod.spec.containers or []),
                "initContainers": serialize(pod.spec.init_containers or []),
            }
        )

    def _training_pods(self) -> list[Any]:
        training = {n.metadata.name for n in self.gpu_nodes() if self._pool(n) != "inference"}
        pods = self.core.list_namespaced_pod(self.target.namespace).items
        return [
            p
            for p in pods
            if p.spec.node_name in training
            and p.status.phase in ("Pending", "Running")
            and p.metadata.deletion_timestamp is None
        ]

    def idle_training_gpus(self) -> int:
        free = sum(self._gpus(n) for n in self.gpu_nodes() if self._pool(n) != "inference")
        return free - sum(self._pod_gpus(p) for p in self._training_pods())

    def empty_nodes(self) -> int | None:
        """Training nodes no live pod runs on; None (the policy counts GPUs) unless every
        GPU node holds the ``node_gpus`` the policy moves."""
        nodes = self.gpu_nodes()
        if self.node_gpus is None or any(self._gpus(n) != self.node_gpus for n in nodes):
            return None
        busy = self._busy_nodes()
        return sum(1 for n in nodes if self._pool(n) != "inference" and n.metadata.name not in busy)

    def pinned_nodes(self) -> frozenset[str]:
        """Training nodes running a pod of no tideflow gang, which the broker never evicts."""
        return frozenset(
            p.spec.node_name
            for p in self._training_pods()
            if not (p.metadata.labels or {}).get(GANG_LABEL)
        )

    def _busy_nodes(self) -> set[str]:
        """Training nodes inference cannot take now: a live pod runs on them (an evicted
        one, terminating, no longer counts), or they are cordoned or not Ready."""
        return {p.spec.node_name for p in self._training_pods()} | self._unusable_nodes()

    def _unusable_nodes(self) -> set[str]:
        """GPU nodes cordoned (drained for maintenance) or not Ready: inference's replicas
        would not start there, so the broker neither counts nor takes them."""
        unusable = set()
        for node in self.gpu_nodes():
            conditions = (node.status.conditions or []) if node.status else []
            not_ready = any(c.type == "Ready" and c.status != "True" for c in conditions)
            if node.spec.unschedulable or not_ready:
                unusable.add(node.metadata.name)
        return unusable

    def training_work(self, since_s: float, until_s: float) -> None:
        """None: the cluster keeps no record of the work its preemptions cost (Kueue and
        Volcano journal no usage), so the broker weighs its own journal's (the training
        GPUs it saw at each step, the pods it evicted and the preemptions Kueue counted;
        ``DecisionJournal.training_work``)."""
        return None

    def preemption_counts(self) -> tuple[PreemptionCount, ...] | None:
        """How often the cluster's gang scheduler has stopped each training gang, for
        any cause but the broker (between teams, by priority within one, a drain), as
        the local ledger counts every stop. Kueue: each gang Workload's count
        (``_kueue_preemption_counts``). Volcano keeps no count; tideflow's Jobs carry
        one from each gang's Job to the next (``tideflow.broker.volcano_stops``). None
        where nothing can be read (a Role from before these were listed): logged and
        skipped rather than failing the step that already acted."""
        if self.volcano is not None:
            return self.volcano.counts()
        return self._kueue_preemption_counts()

    def _kueue_preemption_counts(self) -> tuple[PreemptionCount, ...] | None:
        """How often Kueue has preempted each training gang's Workload (pod sets labelled
        ``tideflow.io/gang`` asking for the broker's GPUs): its
        ``status.schedulingStats.evictions`` entries of reason ``Preempted`` (the
        reason Kueue evicts a preemptee with, in its preemption docs,
        site/content/en/docs/concepts/preemption.md; the counter is in the Workload
        CRD's v1beta2 schema). A count, not the ``Evicted`` condition, because the
        condition turns back to False when the workload is admitted again, which can
        happen between two of the broker's steps."""
        if self.target.queue_kind != "kueue":
            return None
        from kubernetes.client.rest import ApiException

        try:
            workloads = self.custom.list_namespaced_custom_object(
                "kueue.x-k8s.io", self.target.kueue_version, self.target.namespace, "workloads"
            )["items"]
        except ApiException as exc:
            log.warning(
                "broker: cannot list Kueue Workloads in %s (%s %s): Kueue's preemptions "
                "are not counted this step (re-apply deploy/kubernetes/broker-rbac.yaml)",
                self.target.namespace,
                exc.status,
                exc.reason,
            )
            return None
        counts = []
        for workload in workloads:
            try:
                gpus = self._gang_gpus(workload)
            except ValueError:
                log.warning(
                    "broker: Workload %s asks for a GPU amount that is not a whole number: "
                    "its preemptions are not counted",
                    workload["metadata"].get("name"),
                )
                continue
            stats = (workload.get("status") or {}).get("schedulingStats") or {}
            count = sum(
                int(e.get("count", 0))
                for e in stats.get("evictions", [])
                if e.get("reason") == KUEUE_PREEMPTED
            )
            if self._gang_pod_sets(workload):
                # Listed even with no GPUs held (all its workers finished): the journal
                # forgets only the workloads the queue no longer holds.
                meta = workload["metadata"]
                created = datetime.fromisoformat(meta["creationTimestamp"].replace("Z", "+00:00"))
                counts.append(PreemptionCount(meta["uid"], count, gpus, created.timestamp()))
        return tuple(counts)

    @staticmethod
    def _gang_pod_sets(workload: dict[str, Any]) -> list[dict[str, Any]]:
        """A Workload's pod sets whose pod template is labelled as a tideflow gang's."""
        return [
            pod_set
            for pod_set in workload.get("spec", {}).get("podSets", [])
            if GANG_LABEL
            in ((pod_set.get("template", {}).get("metadata") or {}).get("labels") or {})
        ]

    def _gang_gpus(self, workload: dict[str, Any]) -> int:
        """The GPUs a Workload's gang pod sets hold (0: no tideflow gang's): each pod's
        effective request, for the pods not yet finished. Those that finished are
        ``status.reclaimablePods`` (per pod set, a count of pods) and hold nothing; for
        tideflow's JobSets, one replicated Job of all the workers, Kueue's JobSet
        integration reports all or none of them (its ReclaimablePods counts succeeded
        replicated Jobs), other integrations part of a pod set."""
        finished = {
            entry.get("name"): int(entry.get("count", 0))
            for entry in (workload.get("status") or {}).get("reclaimablePods") or []
        }
        return sum(
            max(0, int(pod_set.get("count", 1)) - finished.get(pod_set.get("name"), 0))
            * self._spec_gpus(pod_set.get("template", {}).get("spec", {}))
            for pod_set in self._gang_pod_sets(workload)
        )

    def _spec_gpus(self, spec: dict[str, Any]) -> int:
        """GPUs a pod with this spec holds, by the Kubernetes rule for a pod's effective
        request: its containers' sum plus its sidecars' (init containers with
        ``restartPolicy: Always``, running beside them), or, if higher, the most any
        other init container holds with the sidecars started before it."""
        sidecars = init_peak = 0
        for container in spec.get("initContainers") or []:
            if container.get("restartPolicy") == "Always":
                sidecars += self._container_gpus(container)
            else:
                init_peak = max(init_peak, sidecars + self._container_gpus(container))
        app = sum(self._container_gpus(c) for c in spec.get("containers") or [])
        return max(app + sidecars, init_peak)

    def _container_gpus(self, container: dict[str, Any]) -> int:
        """GPUs a container asks for (its requests, else its limits: an extended
        resource's request defaults to its limit)."""
        resources = container.get("resources") or {}
        amount = (resources.get("requests") or {}).get(self.target.gpu_resource)
        if amount is None:
            amount = (resources.get("limits") or {}).get(self.target.gpu_resource, "0")
        return int(str(amount))

    def gangs(self) -> tuple[GangView, ...]:
        """Gangs on the training pool, by their pods' ``tideflow.io/gang`` label.

        The work at risk runs from the gang's newest committed checkpoint, read
        from the store its pods are given (``TIDEFLOW_CHECKPOINT_URI``; the
        broker needs read access to it), or from its pods' start when there is
        none or the store cannot be read.
        """
        views = []
        for gang, pods in sorted(_by_gang(self._training_pods()).items()):
            starts = [p.status.start_time.timestamp() for p in pods if p.status.start_time]
            views.append(
                GangView(
                    gang,
                    sum(self._pod_gpus(p) for p in pods),
                    min(int(p.spec.priority or 0) for p in pods),
                    work_at_risk_since(min(starts, default=0.0), _checkpoint_store(pods)),
                    nodes=tuple(sorted({p.spec.node_name for p in pods if p.spec.node_name})),
                )
            )
        return tuple(views)

    # -- acting -------------------------------------------------------------------------
    def _set_pool(self, node: Any, pool: str) -> None:
        # Read again: the list is sent back whole, and while the broker waited for an
        # eviction someone may have added a taint (a GPU health check) it must keep.
        node = self.core.read_node(node.metadata.name)
        taints = [t for t in (node.spec.taints or []) if getattr(t, "key", None) != TAINT_KEY]
        body = {
            "metadata": {"labels": {POOL_LABEL: pool}},
            "spec": {
                # A merge patch replaces the list whole: the other taints go back as read,
                # or deploy/kubernetes/broker-rbac.yaml's admission policy refuses the patch.
                "taints": [_taint(t) for t in taints]
                # Pods that are no pool's stay off; a pool's pods tolerate the key and
                # choose their pool by the label (tideflow.kube.pods).
                + [{"key": TAINT_KEY, "value": pool, "effect": "NoSchedule"}]
            },
        }
        self.core.patch_node(node.metadata.name, body, _content_type=MERGE)

    def _scale_inference(self, gpus: int) -> None:
        replicas = gpus // self.target.gpus_per_replica
        if self.target.hpa:
            self.autoscaling.patch_namespaced_horizontal_pod_autoscaler(
                self.target.hpa,
                self.target.namespace,
                {"spec": {"minReplicas": max(1, replicas), "maxReplicas": max(1, replicas)}},
                _content_type=MERGE,
            )
        else:
            self.apps.patch_namespaced_deployment_scale(
                self.target.inference_deployment,
                self.target.namespace,
                {"spec": {"replicas": replicas}},
                _content_type=MERGE,
            )

    def _set_volcano_capability(self, gpus: int) -> int:
        """Set the training queue's GPU capability to ``gpus``, or to its deserved if that
        is more; the capability written.

        Volcano's queue webhook (validate_queue.go, on every change of a queue's
        capability) admits a queue only with guarantee <= deserved <= capability, a parent
        whose deserved covers its children's summed and whose capability covers each
        child's. The training queue's deserved is the teams' deserved summed and cannot
        follow a smaller loan, so neither can its capability: below it, the pool's label
        and taint alone keep training on the lent nodes. A refusal that reading the queue
        cannot foresee (a team queue's own capability, a legacy parent without deserved)
        raises TrainingQueueRefusedError with the webhook's reason.
        """
        from kubernetes.client.rest import ApiException
        from kubernetes.utils import parse_quantity

        name, resource = self.target.training_queue, self.target.gpu_resource
        if name == "root":
            raise ValueError(
                "the broker's training queue cannot be Volcano's root queue: its capability, "
                "deserved and guarantee cannot be modified (the queue webhook's root queue "
                "protection); set TIDEFLOW_K8S_TRAINING_QUEUE to the teams' parent queue"
            )
        queue = self.custom.get_cluster_custom_object(
            "scheduling.volcano.sh", "v1beta1", "queues", name
        )
        deserved = ((queue.get("spec") or {}).get("deserved") or {}).get(resource)
        floor = math.ceil(parse_quantity(deserved)) if deserved is not None else 0
        capability = max(gpus, floor)
        try:
            self.custom.patch_cluster_custom_object(
                "scheduling.volcano.sh",
                "v1beta1",
                "queues",
                name,
                {"spec": {"capability": {resource: str(capability)}}},
                _content_type=MERGE,
            )
        except ApiException as exc:
            if exc.status not in (400, 422):
                raise
            raise TrainingQueueRefusedError(
                f"Volcano refused capability {resource}={capability} on the training queue "
                f"{name} ({gpus} GPUs lent, deserved {deserved or 'unset'}): {_refusal(exc)}. "
                "Its team queues' deserved must sum to at most its deserved, and they must "
                "set no capability of their own for that resource "
                "(deploy/kubernetes/volcano-queues.yaml)"
            ) from exc
        return capability

    def _set_training_quota(self, gpus: int) -> int:
        """Move the training queue's GPU quota to ``gpus``; the quota written."""
        if self.target.queue_kind == "volcano":
            return self._set_volcano_capability(gpus)
        queue = self.custom.get_cluster_custom_object(
            "kueue.x-k8s.io", self.target.kueue_version, "clusterqueues", self.target.training_queue
        )
        groups = queue["spec"]["resourceGroups"]
        changed = False
        for group in groups:
            for flavor in group.get("flavors", []):
                if self.target.kueue_flavor not in (None, flavor["name"]):
                    continue
                for resource in flavor.get("resources", []):
                    if resource["name"] == self.target.gpu_resource:
                        resource["nominalQuota"] = str(gpus)
                        changed = True
        if not changed:
            raise ValueError(
                f"ClusterQueue {self.target.training_queue} has no {self.target.gpu_resource} "
                f"quota in flavor {self.target.kueue_flavor or '(any)'}"
            )
        # resourceGroups is a list: a merge patch replaces it whole, so send it whole.
        self.custom.patch_cluster_custom_object(
            "kueue.x-k8s.io",
            self.target.kueue_version,
            "clusterqueues",
            self.target.training_queue,
            {"spec": {"resourceGroups": groups}},
            _content_type=MERGE,
        )
        return gpus

    def _evict_gang(self, gang_id: str, deadline: float, grace_s: float | None = None) -> Evictions:
        """Evict the gang's pods, retrying a PDB's refusal until ``deadline``; with
        ``grace_s``, its pods get that long to stop (the Eviction's DeleteOptions), else
        their own terminationGracePeriodSeconds."""
        from kubernetes import client

        pods = self.core.list_namespaced_pod(
            self.target.namespace, label_selector=f"{GANG_LABEL}={gang_id}"
        ).items
        options = (
            None if grace_s is None else client.V1DeleteOptions(grace_period_seconds=int(grace_s))
        )
        # Mark the stop on the gang's Volcano Job before the eviction can abort it (the
        # Job that replaces it counts the abort as the broker's then), and take the mark
        # back if no pod went, whatever happened meanwhile.
        marked = self.volcano.mark(gang_id) if pods and self.volcano is not None else None
        done = Evictions()
        try:
            self._evict_pods(pods, deadline, options, done)
        finally:
            if marked is not None and not done.evicted and self.volcano is not None:
                self.volcano.unmark(gang_id, marked)
        return done

    def _evict_pods(self, pods: list[Any], deadline: float, options: Any, done: Evictions) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        for pod in pods:
            name = pod.metadata.name
            body = client.V1Eviction(
                metadata=client.V1ObjectMeta(name=name, namespace=self.target.namespace),
                delete_options=options,
            )
            while True:
                try:
                    self.core.create_namespaced_pod_eviction(name, self.target.namespace, body)
                    done.evicted.append(name)
                    done.gpus += self._pod_gpus(pod)
                    break
                except ApiException as exc:
                    if exc.status == 404:  # already gone
                        break
                    if exc.status != 429 or self.clock() >= deadline:
                        if exc.status == 429:
                            done.refused.append(name)  # the PDB still says no: leave it
                            done.kept_on.add(pod.spec.node_name)
                            break
                        raise
                    self.sleep(self.retry_s)  # a PDB refuses for now: try again

    # -- inference as a team of the cluster file ------------------------------------------
    def _key(self) -> Key:
        assert self.teams is not None
        return self.teams.key(INFERENCE_TEAM, self.device_class, self.model)

    def _within_rules(self, wanted: int, total: int) -> tuple[int, str]:
        """The GPUs to hold for a decision of ``wanted``: at most inference's quota, and
        no less than the part of it inference's rules let nobody borrow (the compiled
        queues would lend it to any team), with the note's words for either."""
        assert self.teams is not None
        key = self._key()
        target, note = capped(wanted, ceiling(self.teams, key, total))
        least = floor(self.teams, key, total)
        if target < least:
            target = least
            note += (
                f"; held at {least}: inference's rules lend at most "
                f"{lendable(self.teams, key)} of its quota of "
                f"{self.teams.nominal(INFERENCE_TEAM, key)}"
            )
        return target, note

    def _pool_gangs(self, pods: list[Any], now: float) -> list[PoolGang]:
        """The gangs on the training pool with their teams, from their pods' team label."""
        assert self.teams is not None
        teams = {dns_label(t): t for t in self.teams.teams}
        found = []
        for gang, mine in sorted(_by_gang(pods).items()):
            starts = [p.status.start_time.timestamp() for p in mine if p.status.start_time]
            started = min(starts, default=0.0)
            label = (mine[0].metadata.labels or {}).get(TEAM_LABEL)
            found.append(
                PoolGang(
                    gang,
                    teams.get(label) if label else None,
                    sum(self._pod_gpus(p) for p in mine),
                    min(int(p.spec.priority or 0) for p in mine),
                    started,
                    max(0.0, now - work_at_risk_since(started, _checkpoint_store(mine))),
                )
            )
        return found

    def _grow_as_tenant(
        self, training: list[Any], have: int, target: int, total: int
    ) -> tuple[list[Any], tuple[Eviction, ...], list[str]]:
        """The nodes to take and the gangs to evict first, by the lender's reclaim; why
        it falls short, where it does.

        The policy's own victims are not used: they may run within their team's quota.
        A gang on the pool is stopped only when the teams' rules, replayed over the
        gangs in the order they started, say it borrows what inference lends (or what
        the rules return after auto_return_timeout), exactly as the ledger would stop
        it locally. A gang beyond its team's quota that no rule lets borrow of
        inference is not stopped either: it holds what no rule gives inference a claim
        on (the shared pool, another team's idle quota) or what the engine's queues let
        it take outside the rules, and the broker acts within the rules, not as their
        judge. The nodes such gangs run on stay training's, and the note names them.
        """
        assert self.teams is not None
        pods = self._training_pods()
        now = time.time()
        on_node: dict[str, set[str]] = {}
        for pod in pods:
            # A pod of no gang is never evicted: named as a gang no rule lets anyone
            # stop, it keeps its node training's as a non-borrowing gang would.
            gang = (pod.metadata.labels or {}).get(GANG_LABEL) or f"pod {pod.metadata.name}"
            on_node.setdefault(pod.spec.node_name, set()).add(gang)
        unusable = self._unusable_nodes()
        held = borrowers(
            self.teams, self._pool_gangs(pods, now), have, self.device_class, self.model
        )
        growth = grow(
            self.teams,
            held,
            [
                PoolNode(
                    n.metadata.name, self._gpus(n), frozenset(on_node.get(n.metadata.name, ()))
                )
                for n in training
                if n.metadata.name not in unusable
            ],
            have=have,
            target=target,
            most=ceiling(self.teams, self._key(), total),
            device_class=self.device_class,
            model=self.model,
            now=now,
        )
        by_name = {n.metadata.name: n for n in training}
        nodes = [by_name[name] for name in growth.nodes]
        why: list[str] = []
        if have + sum(self._gpus(n) for n in nodes) < target:
            if growth.kept_by:
                why.append(
                    "the nodes left run gangs or pods inference may not reclaim ("
                    + _few(growth.kept_by)
                    + ")"
                )
            skipped = sorted(n.metadata.name for n in training if n.metadata.name in unusable)
            if skipped:
                why.append(f"cordoned or not Ready: {_few(skipped)}")
            if not why:
                why.append("no whole node left within inference's quota")
        return nodes, growth.evictions, why

    def _take_as_tenant(
        self,
        training: list[Any],
        inference: list[Any],
        *,
        have: int,
        wanted: int,
        total: int,
        started: float,
    ) -> tuple[int, Evictions, str]:
        """Grow as inference's tenant: evict the borrowers, then take the nodes they
        emptied (appended to ``inference``). The GPUs held then, what the evictions did,
        and the note's words when it falls short."""
        taking, evictions, why = self._grow_as_tenant(training, have, wanted, total)
        done = Evictions()
        for eviction in evictions:  # each waits its own rule's grace
            done.add(
                self._evict_gang(eviction.gang_id, started + eviction.grace_s, eviction.grace_s)
            )
        # A node still busy after the evictions is not taken: a PDB kept its gang past
        # the grace, or while the broker waited a pod was placed on it or it was
        # cordoned.
        busy = self._busy_nodes() if evictions else set()
        for node in taking:
            if node.metadata.name in busy:
                continue
            self._set_pool(node, "inference")
            inference.append(node)
            have += self._gpus(node)
        kept = sorted(n.metadata.name for n in taking if n.metadata.name in done.kept_on)
        other = sorted(
            n.metadata.name
            for n in taking
            if n.metadata.name in busy and n.metadata.name not in done.kept_on
        )
        if kept:
            why.append(f"a PDB kept pods on {_few(kept)}")
        if other:
            why.append(f"{_few(other)} became busy, cordoned or not Ready during the wait")
        note = f"; {wanted - have} GPUs short: " + "; ".join(why) if have < wanted else ""
        return have, done, note

    def apply(self, decision: Decision) -> KubernetesApplied:
        started = self.clock()
        nodes = self.gpu_nodes()
        total = sum(self._gpus(n) for n in nodes)
        inference = [n for n in nodes if self._pool(n) == "inference"]
        training = [n for n in nodes if self._pool(n) != "inference"]
        have = sum(self._gpus(n) for n in inference)
        done = Evictions()
        wanted, rules_note = decision.inference_gpus, ""
        if self.tenant:
            wanted, rules_note = self._within_rules(wanted, total)
        if wanted > have and self.tenant:
            have, done, short = self._take_as_tenant(
                training, inference, have=have, wanted=wanted, total=total, started=started
            )
            rules_note += short
        elif wanted > have:
            deadline = started + self.grace_s
            for reclaim in decision.reclaims:
                if reclaim.evicted:
                    done.add(self._evict_gang(reclaim.gang_id, deadline))
            # Take whole empty nodes (the ones the evictions emptied; by name for a
            # stable order): a node still running a pod would put inference's
            # replicas beside its workers. What is still busy is a shortfall.
            busy = self._busy_nodes()
            for node in training:
                if have >= wanted:
                    break
                if node.metadata.name in busy:
                    continue
                self._set_pool(node, "inference")
                inference.append(node)
                have += self._gpus(node)
            if have < wanted:
                rules_note += (
                    f"; {wanted - have} GPUs short: the other training nodes still run pods "
                    "or are cordoned or not Ready"
                    + (" (a PDB kept the evictions)" if done.refused else "")
                )
        elif wanted < have:
            for node in sorted(inference, key=lambda n: n.metadata.name, reverse=True):
                if have - self._gpus(node) < wanted:
                    continue
                self._set_pool(node, "training")
                inference.remove(node)
                have -= self._gpus(node)
        self._scale_inference(have)
        quota = self._set_training_quota(total - have)
        return KubernetesApplied(
            have,
            tuple(n.metadata.name for n in inference),
            tuple(done.evicted),
            tuple(done.refused),
            f"inference {have}/{total} GPUs on {len(inference)} node(s)"
            + rules_note
            + (f"; PDB kept {', '.join(done.refused)}" if done.refused else "")
            + (
                f"; training queue capability held at its deserved {quota} "
                f"({total - have} GPUs lent)"
                if quota > total - have
                else ""
            ),
            done.gpus,
        )
