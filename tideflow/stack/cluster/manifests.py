"""Upstream's CRDs and webhook configurations, pointed at controllers running on 127.0.0.1.

Kueue and JobSet publish their CRDs and webhook configurations in their Go
modules (``config/components``), written for a controller behind a Service in
the cluster. Here each controller is a process on this machine, so every
webhook's ``clientConfig`` (and each CRD's conversion webhook) becomes a URL on
127.0.0.1 with the local CA. The files are read from the Go module cache,
where the build put them, never copied into this repository.
"""

from __future__ import annotations

import base64
import copy
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from tideflow.stack.cluster.build import MODULES, Component
from tideflow.stack.processes import StackError

Object = dict[str, Any]
# Which webhooks to keep: those whose rules touch only these API groups. Kueue
# registers webhooks for every framework it knows; this cluster enables two.
KUEUE_GROUPS = frozenset({"kueue.x-k8s.io", "batch", "jobset.x-k8s.io"})
KUEUE_CONVERTED = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")
# JobSet's own kustomize patch: its pod webhooks see only the pods of JobSets.
JOBSET_POD_SELECTOR = {
    "matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]
}


def module_dir(component: Component) -> Path:
    done = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Dir}}", component.module],
        cwd=MODULES / component.name,
        capture_output=True,
        text=True,
        check=False,
    )
    path = Path(done.stdout.strip())
    if done.returncode != 0 or not path.is_dir():
        raise StackError(f"{component.module} is not in the Go module cache: {done.stderr}")
    return path


def documents(path: Path) -> list[Object]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def crds(source: Path, convert: Iterable[str], url: str, ca: bytes) -> list[Object]:
    """Every CRD in ``config/components/crd/bases``; those named in ``convert`` get the webhook."""
    converted = set(convert)
    objects = []
    for path in sorted((source / "config" / "components" / "crd" / "bases").glob("*.yaml")):
        for crd in documents(path):
            if crd["spec"]["names"]["plural"] in converted:
                crd["spec"]["conversion"] = {
                    "strategy": "Webhook",
                    "webhook": {
                        "clientConfig": {"url": f"{url}/convert", "caBundle": _b64(ca)},
                        "conversionReviewVersions": ["v1"],
                    },
                }
            objects.append(crd)
    return objects


def webhooks(
    source: Path,
    prefix: str,
    *,
    url: str,
    ca: bytes,
    keep: Callable[[Object], bool] = lambda _: True,
    adjust: Callable[[Object], None] = lambda _: None,
) -> list[Object]:
    """The module's webhook configurations, renamed ``prefix-...`` and served at ``url``."""
    objects = []
    for published in documents(source / "config" / "components" / "webhook" / "manifests.yaml"):
        config = copy.deepcopy(published)
        config["metadata"]["name"] = f"{prefix}-{config['metadata']['name']}"
        kept = []
        for hook in config["webhooks"]:
            if not keep(hook):
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{url}{path}", "caBundle": _b64(ca)}
            adjust(hook)
            kept.append(hook)
        config["webhooks"] = kept
        objects.append(config)
    return objects


def touches_only(groups: frozenset[str]) -> Callable[[Object], bool]:
    def keep(hook: Object) -> bool:
        return all(set(rule["apiGroups"]) <= groups for rule in hook["rules"])

    return keep


def jobset_pod_selector(hook: Object) -> None:
    if any("pods" in rule["resources"] for rule in hook["rules"]):
        hook["objectSelector"] = JOBSET_POD_SELECTOR


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
