"""The patch formats the API server accepts, applied as it applies them.

* ``application/merge-patch+json``: RFC 7386 (a null deletes, objects merge,
  anything else, lists included, replaces).
* ``application/json-patch+json``: RFC 6902 operations (add, remove, replace,
  move, copy, test); a body that is not a list is refused as the API server
  refuses it (400, the body cannot be read as a list of operations).
* ``application/strategic-merge-patch+json``: for built-in kinds only (the API
  server answers 415 for custom resources). Lists whose Go type declares
  ``patchStrategy:"merge"`` merge their items by the ``patchMergeKey`` (the table
  below holds those of the fields tideflow's objects have: containers and env
  by name, conditions by type, ...); other lists replace. ``$patch: delete`` and
  ``$patch: replace`` directives are honoured; ``$setElementOrder`` is ignored.
  (k8s.io/apimachinery pkg/util/strategicpatch, documented in "Update API
  Objects in Place Using kubectl patch".)
"""

from __future__ import annotations

import copy
from typing import Any

from tests.kubefake.status import ApiError

MERGE = "application/merge-patch+json"
JSON = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"

# Field name -> merge key, for lists with patchStrategy "merge" in the core Go types.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "conditions": "type",
    "imagePullSecrets": "name",
    "ownerReferences": "uid",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name",
}
# Lists of scalars with patchStrategy "merge" (their items are a set).
MERGE_SETS = {"finalizers"}


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, f"the JSON pointer {path!r} does not start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> tuple[Any, str]:
    current = doc
    for part in parts[:-1]:
        if isinstance(current, list):
            current = current[int(part)]
        elif isinstance(current, dict) and part in current:
            current = current[part]
        else:
            raise ApiError(422, f"the path {'/'.join(parts)!r} does not exist")
    return current, parts[-1]


def _get(doc: Any, parts: list[str]) -> Any:
    current = doc
    for part in parts:
        current = current[int(part)] if isinstance(current, list) else current[part]
    return current


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent, last = _parent(doc, parts)
    if isinstance(parent, list):
        parent.insert(len(parent) if last == "-" else int(last), value)
    else:
        parent[last] = value
    return doc


def _remove(doc: Any, parts: list[str]) -> Any:
    parent, last = _parent(doc, parts)
    try:
        del parent[int(last) if isinstance(parent, list) else last]
    except (KeyError, IndexError, ValueError):
        raise ApiError(422, f"the path {'/'.join(parts)!r} does not exist") from None
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    if not isinstance(operations, list):
        raise ApiError(
            400,
            "json: cannot unmarshal object into Go value of type []handlers.jsonPatchOp",
        )
    doc = copy.deepcopy(target)
    for op in operations:
        kind, parts = op.get("op"), _pointer(op.get("path", ""))
        try:
            if kind == "add":
                doc = _add(doc, parts, copy.deepcopy(op["value"]))
            elif kind == "remove":
                doc = _remove(doc, parts)
            elif kind == "replace":
                doc = _add(_remove(doc, parts), parts, copy.deepcopy(op["value"]))
            elif kind in ("move", "copy"):
                source = _pointer(op["from"])
                value = copy.deepcopy(_get(doc, source))
                if kind == "move":
                    doc = _remove(doc, source)
                doc = _add(doc, parts, value)
            elif kind == "test":
                if _get(doc, parts) != op["value"]:
                    raise ApiError(422, f"the test of {op['path']!r} failed")
            else:
                raise ApiError(400, f"unexpected JSON patch operation {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError):
            raise ApiError(422, f"the JSON patch operation {op!r} cannot be applied") from None
    return doc


def _strategic_list(field: str, target: list[Any], patch: list[Any]) -> list[Any]:
    if field in MERGE_SETS:
        merged = list(target)
        merged += [item for item in patch if item not in merged]
        return merged
    key = MERGE_KEYS.get(field)
    if key is None or not all(isinstance(item, dict) for item in patch):
        return [
            strategic_merge_patch(None, i) if isinstance(i, dict) else i
            for i in patch
            if not (isinstance(i, dict) and "$patch" in i)
        ]
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in patch):
        return [
            {k: v for k, v in i.items() if k != "$patch"}
            for i in patch
            if i.get("$patch") != "replace"
        ]
    merged = [copy.deepcopy(i) for i in target]
    for item in patch:
        index = next(
            (n for n, old in enumerate(merged) if old.get(key) == item.get(key)),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                merged.pop(index)
        elif index is None:
            merged.append(strategic_merge_patch(None, item))
        else:
            merged[index] = strategic_merge_patch(merged[index], item)
    return merged


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$patch", "$retainKeys"):
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _strategic_list(key, result[key], value)
        elif isinstance(value, list):
            result[key] = _strategic_list(key, [], value)
        else:
            merged = strategic_merge_patch(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
    return result


def apply_patch(content_type: str, target: dict[str, Any], body: Any, *, custom: bool) -> Any:
    """The object after the patch; ApiError for a format the API server would refuse."""
    kind = content_type.split(";", maxsplit=1)[0].strip()
    if kind == MERGE:
        return merge_patch(target, body)
    if kind == JSON:
        return json_patch(target, body)
    if kind == STRATEGIC:
        if custom:
            raise ApiError(
                415,
                "the body of the request was in an unknown format - accepted media types "
                f"include: {JSON}, {MERGE}, {APPLY}",
            )
        return strategic_merge_patch(target, body)
    raise ApiError(
        415,
        "the body of the request was in an unknown format - accepted media types include: "
        f"{JSON}, {MERGE}, {STRATEGIC}, {APPLY}",
    )
