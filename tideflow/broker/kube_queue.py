"""The training queue's GPU quota, moved with the GPUs the broker lends to training.

A Volcano Queue's ``capability`` or a Kueue ClusterQueue flavor's ``nominalQuota``
for the GPU resource. The Volcano queue is the parent of the team queues, and
Volcano's queue webhook admits a change only while the teams' deserved, summed,
stay within its ``deserved`` and that within its ``capability``: its ``deserved``
(the teams' sum) is the operator's, and the broker sets the capability to the GPUs
it lends but never below that ``deserved`` (deploy/kubernetes/volcano-queues.yaml).
"""

from __future__ import annotations

import json
import math
from typing import Any

from tideflow.broker.kube_target import ClusterTarget
from tideflow.kube.client import MERGE, on_conflict_read_again


class TrainingQueueRefusedError(RuntimeError):
    """The API server refused the training queue's new quota (a webhook or the schema)."""


def refusal(exc: Any) -> str:
    """The reason an API server gave in its Status body, or the HTTP reason."""
    try:
        return str(json.loads(exc.body)["message"])
    except (TypeError, ValueError, KeyError):
        return f"{exc.status} {exc.reason}"


class TrainingQueue:
    def __init__(self, custom: Any, target: ClusterTarget) -> None:
        self.custom = custom
        self.target = target

    def set_quota(self, gpus: int) -> int:
        """Move the training queue's GPU quota to ``gpus``; the quota written."""
        if self.target.queue_kind == "volcano":
            return self.set_volcano_capability(gpus)
        return self.set_kueue_quota(gpus)

    def set_volcano_capability(self, gpus: int) -> int:
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
                f"{name} ({gpus} GPUs lent, deserved {deserved or 'unset'}): {refusal(exc)}. "
                "Its team queues' deserved must sum to at most its deserved, and they must "
                "set no capability of their own for that resource "
                "(deploy/kubernetes/volcano-queues.yaml)"
            ) from exc
        return capability

    def set_kueue_quota(self, gpus: int) -> int:
        """Set the GPU ``nominalQuota`` of the ClusterQueue's flavor (every flavor with
        that resource, unless ``kueue_flavor`` names one); ``gpus``.

        ``resourceGroups`` is a list, which a merge patch replaces whole: the patch
        carries the resourceVersion it was read at, so an edit made meanwhile (another
        flavor's quota, a borrowing limit) is a 409 Conflict, read again, not lost.
        """
        on_conflict_read_again(lambda: self._patch_kueue_quota(gpus))
        return gpus

    def _patch_kueue_quota(self, gpus: int) -> None:
        from kubernetes.utils import parse_quantity

        queue = self.custom.get_cluster_custom_object(
            "kueue.x-k8s.io", self.target.kueue_version, "clusterqueues", self.target.training_queue
        )
        groups = queue["spec"]["resourceGroups"]
        quotas = [
            resource
            for group in groups
            for flavor in group.get("flavors", [])
            if self.target.kueue_flavor in (None, flavor["name"])
            for resource in flavor.get("resources", [])
            if resource["name"] == self.target.gpu_resource
        ]
        if not quotas:
            raise ValueError(
                f"ClusterQueue {self.target.training_queue} has no {self.target.gpu_resource} "
                f"quota in flavor {self.target.kueue_flavor or '(any)'}"
            )
        if all(parse_quantity(resource["nominalQuota"]) == gpus for resource in quotas):
            return  # as it is: no write, no watch event for Kueue
        for resource in quotas:
            resource["nominalQuota"] = str(gpus)
        self.custom.patch_cluster_custom_object(
            "kueue.x-k8s.io",
            self.target.kueue_version,
            "clusterqueues",
            self.target.training_queue,
            {
                "metadata": {"resourceVersion": queue["metadata"]["resourceVersion"]},
                "spec": {"resourceGroups": groups},
            },
            _content_type=MERGE,
        )
