"""What the scheduler and the kubelets do to pods, done when the test says so.

No pod runs: a pod stays Pending until the test places it (``run``), and ends when
the test ends it (``succeed``, ``fail``) or when it is evicted or deleted
(``delete``: graceful, it stays Terminating until ``finish_terminating``). Each
change is written to the pod's status as a kubelet writes it (phase,
``startTime``, the Ready condition, the container's ``state.terminated.exitCode``)
and handed to the controller that owns the pod (Volcano's job controller, or the
Job controller under a JobSet).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from tests.kubefake.resources import BY_KIND
from tests.kubefake.store import now

if TYPE_CHECKING:
    from tests.kubefake.fake import KubeFake

POD = BY_KIND[("v1", "Pod")]


def owner_kind(pod: dict[str, Any]) -> tuple[str, str] | None:
    for owner in pod["metadata"].get("ownerReferences") or []:
        if owner.get("controller"):
            return owner["apiVersion"], owner["kind"]
    return None


def _container_status(
    container: dict[str, Any], *, ready: bool, state: dict[str, Any]
) -> dict[str, Any]:
    return {
        "name": container["name"],
        "image": container.get("image", ""),
        "imageID": "",
        "ready": ready,
        "restartCount": 0,
        "state": state,
    }


class Pods:
    def __init__(self, fake: KubeFake) -> None:
        self.fake = fake
        # The exit code of a worker stopped by SIGTERM (eviction, deletion). tideflow's
        # runtime exits 75 after its checkpoint; a process killed outright exits 143.
        self.termination_exit_code = 143

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        found = self.fake.store.get(POD, namespace, name)
        if found is None:
            raise KeyError(f"no pod {namespace}/{name}")
        return found

    def _write(self, pod: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        return self.fake.write_status(POD, pod, {**(pod.get("status") or {}), **status})

    def run(
        self, namespace: str, name: str, *, node: str = "node-0", started: str | None = None
    ) -> dict[str, Any]:
        """Bind the pod to ``node`` (the scheduler) and start it, Ready (the kubelet)."""
        pod = self.get(namespace, name)
        pod["spec"]["nodeName"] = node
        pod = self.fake.store.update(POD, pod)
        when = started or now()
        containers = [
            _container_status(c, ready=True, state={"running": {"startedAt": when}})
            for c in pod["spec"].get("containers", [])
        ]
        pod = self._write(
            pod,
            {
                "phase": "Running",
                "startTime": when,
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": containers,
            },
        )
        self.fake.controllers.pod_changed(pod)
        return pod

    def _terminated(
        self, pod: dict[str, Any], phase: str, exit_code: int, condition: dict | None = None
    ) -> dict[str, Any]:
        containers = [
            _container_status(
                c, ready=False, state={"terminated": {"exitCode": exit_code, "finishedAt": now()}}
            )
            for c in pod["spec"].get("containers", [])
        ]
        conditions = [{"type": "Ready", "status": "False"}] + ([condition] if condition else [])
        return self._write(
            pod, {"phase": phase, "conditions": conditions, "containerStatuses": containers}
        )

    def succeed(self, namespace: str, name: str) -> dict[str, Any]:
        pod = self._terminated(self.get(namespace, name), "Succeeded", 0)
        self.fake.controllers.pod_changed(pod)
        return pod

    def fail(self, namespace: str, name: str, exit_code: int = 1) -> dict[str, Any]:
        pod = self._terminated(self.get(namespace, name), "Failed", exit_code)
        self.fake.controllers.pod_changed(pod)
        return pod

    def delete(self, pod: dict[str, Any], *, evicted: bool = False) -> None:
        """Graceful deletion ("Termination of Pods"): a pod that runs on a node gets its
        deletionTimestamp and its kubelet stops it (SIGTERM: the container ends with
        ``termination_exit_code`` and the pod is Failed, with the DisruptionTarget condition
        when evicted, as with PodDisruptionConditions); it stays Terminating until
        ``finish_terminating``. A pod on no node, or finished, goes at once."""
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            return
        status = pod.get("status") or {}
        if status.get("phase") != "Running" or not pod["spec"].get("nodeName"):
            self.fake.api.remove(POD, pod)
            return
        meta["deletionTimestamp"] = now()
        meta["deletionGracePeriodSeconds"] = pod["spec"].get("terminationGracePeriodSeconds", 30)
        pod = self.fake.store.update(POD, pod)
        condition = (
            {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
            if evicted
            else None
        )
        pod = self._terminated(pod, "Failed", self.termination_exit_code, condition)
        self.fake.controllers.pod_changed(pod)

    def finish_terminating(self, namespace: str = "") -> int:
        """The kubelets confirm every terminating pod gone: they leave the API."""
        gone = 0
        for pod in self.fake.store.list(POD, namespace)[0]:
            if pod["metadata"].get("deletionTimestamp"):
                self.fake.api.remove(POD, pod)
                gone += 1
        return gone


def terminating(pod: dict[str, Any]) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


_FIELD = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")
_PLAIN_FIELDS = {
    "metadata.name": ("metadata", "name"),
    "metadata.namespace": ("metadata", "namespace"),
    "metadata.uid": ("metadata", "uid"),
    "spec.nodeName": ("spec", "nodeName"),
    "spec.serviceAccountName": ("spec", "serviceAccountName"),
}


def container_environment(pod: dict[str, Any], container: str | None = None) -> dict[str, str]:
    """The environment the kubelet gives a container from its ``env`` list: plain values,
    and downward-API ``fieldRef`` values read from the pod (Kubernetes
    pkg/kubelet/kubelet_pods.go makeEnvironmentVariables and podFieldSelectorRuntimeValue;
    the documentation's "Expose Pod Information to Containers Through Environment
    Variables"). A key the pod lacks is an empty string, as the kubelet gives it.
    ``secretKeyRef`` and ``configMapKeyRef`` variables (Volcano's svc plugin adds
    some) are left out: the fake has no kubelet to fetch them."""
    containers = pod["spec"]["containers"]
    chosen = next(c for c in containers if container in (None, c["name"]))
    env: dict[str, str] = {}
    for variable in chosen.get("env") or []:
        if "value" in variable or "valueFrom" not in variable:
            env[variable["name"]] = variable.get("value", "")
            continue
        path = variable["valueFrom"].get("fieldRef", {}).get("fieldPath")
        if path is None:
            continue
        keyed = _FIELD.match(path)
        if keyed:
            env[variable["name"]] = (pod["metadata"].get(keyed.group(1)) or {}).get(
                keyed.group(2), ""
            )
        elif path in _PLAIN_FIELDS:
            section, key = _PLAIN_FIELDS[path]
            env[variable["name"]] = str(pod.get(section, {}).get(key, ""))
        else:
            raise NotImplementedError(f"{variable['name']}: fieldPath {path} is not resolved here")
    return env
