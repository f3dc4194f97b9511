"""Kubernetes names and label values from free-form ids (DAG run ids, step names)."""

from __future__ import annotations

import hashlib
import re


def dns_label(*parts: str, limit: int = 63) -> str:
    """A DNS-1123 label: lowercase alphanumerics and '-', at most ``limit`` characters.

    Long or lossy names keep a short hash of the original, so two different
    inputs never collapse into one name.
    """
    raw = "-".join(parts)
    name = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)
    if name != raw or len(name) > limit:
        digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
        name = f"{name[: limit - 9].rstrip('-')}-{digest}"
    return name or hashlib.sha256(raw.encode()).hexdigest()[:8]


def gang_object_name(gang_id: str) -> str:
    """A gang's Volcano Job or JobSet name: from its id, so every attempt finds the same one.

    47 characters leave room for the pod host names the gang schedulers derive
    from it (``-worker-0-0``) within a 63-character label.
    """
    return dns_label(gang_id, limit=47)
