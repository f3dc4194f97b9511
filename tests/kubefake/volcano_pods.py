"""The objects Volcano's job controller makes for a Job (volcano @ ed72c7c).

* pods as createJobPod makes them (pkg/controllers/job/job_controller_util.go):
  name ``<job>-<task>-<index>`` (MakePodName), the template's labels and
  annotations plus Volcano's, the job as controller owner, the job's
  schedulerName and priorityClassName where the template has none;
* the env plugin's ``VK_TASK_INDEX`` and ``VC_TASK_INDEX`` (plugins/env/env.go
  OnPodCreate);
* the svc plugin's host name (the pod's name), subdomain (the job's name),
  ``VC_<TASK>_HOSTS`` / ``VC_<TASK>_NUM`` from the hosts ConfigMap mounted at
  /etc/volcano, and, per job, that ConfigMap, a headless Service and a
  NetworkPolicy (plugins/svc/svc.go OnPodCreate, OnJobAdd, GenerateHosts).

Label and annotation keys are volcano apis batch/v1alpha1 labels.go's (written
from memory of that file, which is not in the reference).
"""

from __future__ import annotations

import copy
from typing import Any

from tests.kubefake.resources import BY_KIND

JOB = BY_KIND[("batch.volcano.sh/v1alpha1", "Job")]
JOB_NAME, TASK_SPEC = "volcano.sh/job-name", "volcano.sh/task-spec"
TASK_INDEX = "volcano.sh/task-index"


def owner(job: dict[str, Any]) -> list[dict[str, Any]]:
    meta = job["metadata"]
    return [
        {
            "apiVersion": JOB.api_version,
            "kind": "Job",
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def hosts(job: dict[str, Any]) -> dict[str, str]:
    """plugins/svc/svc.go GenerateHosts."""
    name, data = job["metadata"]["name"], {}
    for task in job["spec"]["tasks"]:
        pod = task["template"].get("spec") or {}
        hosts = []
        for index in range(task["replicas"]):
            host = pod.get("hostname") or f"{name}-{task['name']}-{index}"
            hosts.append(f"{host}.{pod.get('subdomain') or name}")
            if pod.get("hostname"):
                break
        key = task["name"].replace("-", "_")
        data[f"{key}.host"] = "\n".join(hosts)
        data[f"VC_{key.upper()}_HOSTS"] = ",".join(hosts)
        data[f"VC_{key.upper()}_NUM"] = str(len(hosts))
    return data


def svc_objects(job: dict[str, Any]) -> list[dict[str, Any]]:
    """plugins/svc/svc.go OnJobAdd: the hosts ConfigMap, a headless Service, a NetworkPolicy
    admitting the job's own pods."""
    meta = job["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    selector = {JOB_NAME: name, "volcano.sh/job-namespace": namespace}
    common = {"namespace": namespace, "ownerReferences": owner(job)}
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{name}-svc", **common},
            "data": hosts(job),
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, **common},
            "spec": {"clusterIP": "None", "selector": selector},
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": name, **common},
            "spec": {
                "podSelector": {"matchLabels": selector},
                "ingress": [{"from": [{"podSelector": {"matchLabels": selector}}]}],
                "policyTypes": ["Ingress"],
            },
        },
    ]


def make_pod(job: dict[str, Any], task: dict[str, Any], index: int) -> dict[str, Any]:
    """createJobPod plus the env and svc plugins' OnPodCreate."""
    meta, spec, status = job["metadata"], job["spec"], job.get("status") or {}
    name, task_name = meta["name"], task["name"]
    pod_name = f"{name}-{task_name}-{index}"
    template = copy.deepcopy(task["template"])
    pod_spec = template.get("spec") or {}
    pod_spec.setdefault("schedulerName", spec.get("schedulerName"))
    if spec.get("priorityClassName") and not pod_spec.get("priorityClassName"):
        pod_spec["priorityClassName"] = spec["priorityClassName"]
    labels = {
        **((template.get("metadata") or {}).get("labels") or {}),
        TASK_INDEX: str(index),
        JOB_NAME: name,
        TASK_SPEC: task_name,
        "volcano.sh/job-namespace": meta["namespace"],
        "volcano.sh/queue-name": spec["queue"],
    }
    annotations = {
        **((template.get("metadata") or {}).get("annotations") or {}),
        TASK_INDEX: str(index),
        TASK_SPEC: task_name,
        "scheduling.k8s.io/group-name": f"{name}-{meta['uid']}",
        JOB_NAME: name,
        "volcano.sh/queue-name": spec["queue"],
        "volcano.sh/job-version": str(status.get("version", 0)),
        "volcano.sh/template-uid": f"{name}-{task_name}",
        "volcano.sh/job-retry-count": str(status.get("retryCount", 0)),
    }
    plugins = spec.get("plugins") or {}
    containers = pod_spec.get("containers", []) + pod_spec.get("initContainers", [])
    if "env" in plugins:
        for container in containers:
            container.setdefault("env", []).extend(
                [
                    {"name": "VK_TASK_INDEX", "value": str(index)},
                    {"name": "VC_TASK_INDEX", "value": str(index)},
                ]
            )
    if "svc" in plugins:
        pod_spec.setdefault("hostname", pod_name)
        pod_spec.setdefault("subdomain", name)
        config = f"{name}-svc"
        for container in containers:
            for other in spec["tasks"]:
                key = other["name"].replace("-", "_").upper()
                for variable in (f"VC_{key}_HOSTS", f"VC_{key}_NUM"):
                    container.setdefault("env", []).append(
                        {
                            "name": variable,
                            "valueFrom": {"configMapKeyRef": {"name": config, "key": variable}},
                        }
                    )
            container.setdefault("volumeMounts", []).append(
                {"mountPath": "/etc/volcano", "name": config}
            )
        pod_spec.setdefault("volumes", []).append({"name": config, "configMap": {"name": config}})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name,
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": owner(job),
        },
        "spec": pod_spec,
    }
