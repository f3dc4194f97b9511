"""What the API server checks in every object's metadata, before any schema or webhook.

Reimplemented from Kubernetes' ObjectMeta validation, which runs for every
resource, built-in or custom (kubernetes/apimachinery
``pkg/api/validation/objectmeta.go`` ValidateObjectMeta: the name by the
resource's own rule, a DNS-1123 subdomain for most and for custom resources;
``pkg/apis/meta/v1/validation/validation.go`` ValidateLabels: each key a
qualified name, each value ``IsValidLabelValue``; both from
``pkg/util/validation/validation.go``). A CRD's OpenAPI schema does not say
any of this, which is why a gang label of 64 characters passes every schema
and is refused by every real cluster.
"""

from __future__ import annotations

import re
from typing import Any

from tests.kubefake.jobset_webhooks import is_dns1123_subdomain

# validation.go qualifiedNameFmt / labelValueFmt, and their 63-character limits
_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_VALUE_MAX = 63


def label_value_problems(value: str) -> list[str]:
    """validation.IsValidLabelValue's messages."""
    problems = []
    if len(value) > LABEL_VALUE_MAX:
        problems.append(f"must be no more than {LABEL_VALUE_MAX} characters")
    if not _LABEL_VALUE.match(value):
        problems.append(
            "a valid label must be an empty string or consist of alphanumeric characters, "
            "'-', '_' or '.', and must start and end with an alphanumeric character (e.g. "
            "'MyValue',  or 'my_value',  or '12345', regex used for validation is "
            "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
        )
    return problems


def qualified_name_problems(key: str) -> list[str]:
    """validation.IsQualifiedName's messages: an optional DNS-subdomain prefix, then a name."""
    prefix, slash, name = key.rpartition("/")
    problems = []
    if slash:
        if not prefix:
            problems.append("prefix part must be non-empty")
        else:
            problems += [f"prefix part {p}" for p in is_dns1123_subdomain(prefix)]
    if not name:
        problems.append("name part must be non-empty")
    else:
        if len(name) > 63:
            problems.append("name part must be no more than 63 characters")
        if not _NAME_PART.match(name):
            problems.append(
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must "
                "start and end with an alphanumeric character"
            )
    return problems


def object_meta_problems(obj: dict[str, Any]) -> list[str]:
    """Every problem of ``obj``'s name and labels, in the API server's words."""
    meta = obj.get("metadata") or {}
    problems = []
    name = meta.get("name") or ""
    if name:  # a generateName object gets its name later; the server checks it then
        problems += [
            f'metadata.name: Invalid value: "{name}": {p}' for p in is_dns1123_subdomain(name)
        ]
    for key, value in sorted((meta.get("labels") or {}).items()):
        problems += [
            f'metadata.labels: Invalid value: "{key}": {p}' for p in qualified_name_problems(key)
        ]
        problems += [
            f'metadata.labels: Invalid value: "{value}": {p}'
            for p in label_value_problems(str(value))
        ]
    return problems
