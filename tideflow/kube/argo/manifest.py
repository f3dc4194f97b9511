"""A resource template's manifest as YAML text that Argo fills in before creating the object."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml


@dataclass(frozen=True)
class ArgoInt:
    """An integer field of a manifest that Argo fills in: written unquoted, so it stays a number."""

    expression: str


def manifest_yaml(obj: dict[str, Any]) -> str:
    """YAML for a resource template: ``{{...}}`` strings quoted, ``ArgoInt`` fields bare.

    Quoting keeps a filled-in string a string (``'2'``) and stops a value with
    ``: `` from changing the document's shape; a bare ``{{...}}`` becomes a number.
    """
    tokens: dict[str, str] = {}

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        style = "'" if "{{" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    def integer(dumper: yaml.SafeDumper, value: ArgoInt) -> yaml.ScalarNode:
        token = f"tideflow-argo-int-{len(tokens)}"
        tokens[token] = value.expression
        return dumper.represent_scalar("tag:yaml.org,2002:str", token)

    Dumper.add_representer(str, text)
    Dumper.add_representer(ArgoInt, integer)
    dumped = yaml.dump(obj, Dumper=Dumper, sort_keys=True)
    for token, expression in tokens.items():
        dumped = dumped.replace(token, expression)
    return dumped
