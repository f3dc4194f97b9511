"""The manifest: the one object whose presence makes a checkpoint committed.

A manifest (format ``tideflow-checkpoint/v2``) is a JSON object with exactly
these fields:

``format``           ``"tideflow-checkpoint/v2"``
``step``             the step; it must equal the step of the directory holding it
``created_at``       seconds since the epoch
``shards``           ``[{name, key, sha256, size}]``; a shard's key is always
                     ``step-NNNNNNNNNNNN/<name>``, inside the checkpoint's own directory
``expected_shards``  the shard names a complete checkpoint has, sorted; they
                     must be exactly the names in ``shards``
``world_size``       how many ranks wrote it, or ``null`` when no gang did; a gang
                     checkpoint has ``model.pt`` and ``rank-R.pt`` for every rank
                     (:func:`gang_shard_names`) and no rank beyond its world size
``metrics``          ``{name: number}``
``meta``             a JSON object
``body_sha256``      SHA-256 of the canonical JSON of every other field
                     (:func:`body_digest`)

:func:`decode` refuses a manifest that is not exactly that, naming the reason,
so an incomplete or edited checkpoint is never counted as committed. The
digest detects edits and partial rewrites (a metric changed by hand, a field
dropped); it is not a signature: whoever may write the store may also write a
new self-consistent manifest.

Older manifests (``tideflow-checkpoint/v1``: no ``expected_shards``,
``world_size`` nor digest) are still read, with every check that needs none
of those fields: the step, the shard keys, names and types, and, when their
``meta`` records a ``world_size`` (the gang runtime always wrote it), the gang
layout. An edit of a v1 manifest's metrics or meta cannot be detected.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tideflow.storage import UnsafeKeyError, check_key

FORMAT = "tideflow-checkpoint/v2"
FORMAT_V1 = "tideflow-checkpoint/v1"
MANIFEST_NAME = "MANIFEST.json"
MODEL_SHARD = "model.pt"
_CHUNK = 8 * 1024 * 1024
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_RANK_SHARD = re.compile(r"^rank-(\d+)\.pt$")
_SHARD_FIELDS = {"name", "key", "sha256", "size"}
_V1_FIELDS = {"format", "step", "created_at", "shards"}
_V1_OPTIONAL = {"metrics", "meta"}
_V2_FIELDS = _V1_FIELDS | _V1_OPTIONAL | {"expected_shards", "world_size", "body_sha256"}


class CheckpointError(Exception):
    """A checkpoint cannot be written or read as asked."""


class CorruptCheckpointError(CheckpointError):
    """A manifest is malformed or inconsistent, or a shard is missing or damaged."""


@dataclass(frozen=True)
class ShardRecord:
    name: str
    key: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest:
    step: int
    created_at: float
    shards: tuple[ShardRecord, ...]
    metrics: dict[str, float] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    uri: str = ""
    checksum: str = ""  # sha256 of the manifest bytes as stored
    world_size: int | None = None  # ranks that wrote it; None when no gang did
    format: str = FORMAT

    def shard(self, name: str) -> ShardRecord:
        for record in self.shards:
            if record.name == name:
                return record
        raise CheckpointError(
            f"checkpoint step {self.step} has no shard {name!r}; "
            f"it has {[r.name for r in self.shards]}"
        )


def step_prefix(step: int) -> str:
    return f"step-{step:012d}"


def rank_shard(rank: int) -> str:
    return f"rank-{rank}.pt"


def gang_shard_names(world_size: int) -> tuple[str, ...]:
    """The shards of a checkpoint written by a gang: the model, and one per rank."""
    return (MODEL_SHARD, *(rank_shard(rank) for rank in range(world_size)))


def shard_key(step: int, name: str) -> str:
    return f"{step_prefix(step)}/{name}"


# -- writing ---------------------------------------------------------------------------


def body_digest(document: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON (sorted keys, no spaces) of all fields but the digest."""
    body = {key: value for key, value in document.items() if key != "body_sha256"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def encode(
    step: int,
    created_at: float,
    shards: tuple[ShardRecord, ...],
    metrics: Mapping[str, float],
    meta: Mapping[str, Any],
    *,
    world_size: int | None = None,
) -> bytes:
    document: dict[str, Any] = {
        "format": FORMAT,
        "step": step,
        "created_at": created_at,
        "shards": [
            {"name": s.name, "key": s.key, "sha256": s.sha256, "size": s.size} for s in shards
        ],
        "expected_shards": sorted(s.name for s in shards),
        "world_size": world_size,
        "metrics": {name: float(value) for name, value in metrics.items()},
        "meta": dict(meta),
    }
    # Round-trip first, so the digest is taken over exactly what a reader will
    # parse (tuples become lists, non-string keys become strings).
    document = json.loads(json.dumps(document))
    document["body_sha256"] = body_digest(document)
    return json.dumps(document, sort_keys=True, indent=1).encode()


# -- reading ---------------------------------------------------------------------------


def decode(data: bytes, uri: str, directory_step: int) -> Manifest:
    """The manifest stored at ``uri`` in the directory of ``directory_step``.

    Raises ``CorruptCheckpointError`` naming the first problem found.
    """
    try:
        return _decode(data, directory_step, uri, hashlib.sha256(data).hexdigest())
    except _ManifestProblemError as problem:
        raise CorruptCheckpointError(
            f"checkpoint step {directory_step}: manifest {uri} refused: {problem}"
        ) from None


class _ManifestProblemError(Exception):
    """One reason a manifest is refused (wrapped into CorruptCheckpointError with its URI)."""


def _decode(data: bytes, directory_step: int, uri: str, checksum: str) -> Manifest:
    document = _json_object(data)
    version = _check_format(document)
    step = _natural(document["step"], "step")
    if step != directory_step:
        raise _ManifestProblemError(
            f"it records step {step} but is stored in {step_prefix(directory_step)}/"
        )
    created_at = _number(document["created_at"], "created_at")
    if not math.isfinite(created_at):
        raise _ManifestProblemError(f"created_at {created_at} is not a finite number")
    shards = _shards(document["shards"], step)
    metrics = _metrics(document.get("metrics", {}))
    meta = document.get("meta", {})
    if not isinstance(meta, dict):
        raise _ManifestProblemError(f"meta is a JSON {_json_type(meta)}, not an object")
    world_size = _complete_world_size(document, version, [record.name for record in shards])
    return Manifest(step, created_at, shards, metrics, meta, uri, checksum, world_size, version)


def _json_object(data: bytes) -> dict[str, Any]:
    try:
        document = json.loads(data)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError alike
        raise _ManifestProblemError(f"not JSON ({exc})") from None
    if not isinstance(document, dict):
        raise _ManifestProblemError(f"a JSON {_json_type(document)}, not an object")
    return document


def _check_format(document: Mapping[str, Any]) -> str:
    """The manifest's format, once its fields (and, for v2, its digest) are checked."""
    version = document.get("format")
    if version == FORMAT:
        _check_fields(document, _V2_FIELDS)
        if document["body_sha256"] != body_digest(document):
            raise _ManifestProblemError(
                "its body does not match its body_sha256: edited after it was written"
            )
        return FORMAT
    if version == FORMAT_V1:
        _check_fields(document, _V1_FIELDS, _V1_OPTIONAL)
        return FORMAT_V1
    raise _ManifestProblemError(
        f"unknown format {version!r}; accepted: {FORMAT!r} or {FORMAT_V1!r}"
    )


def _complete_world_size(document: Mapping[str, Any], version: str, names: list[str]) -> int | None:
    """The recorded world size, once the shard ``names`` are checked to be complete."""
    meta = document.get("meta", {})
    if version == FORMAT:
        _check_expected_shards(document["expected_shards"], names)
        world_size = _world_size(document["world_size"], meta)
    else:
        world_size = _v1_world_size(meta)
    if world_size is not None:
        problem = gang_layout_problem(names, world_size)
        if problem:
            raise _ManifestProblemError(problem)
    return world_size


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def _check_fields(
    document: Mapping[str, Any], required: Collection[str], optional: Collection[str] = ()
) -> None:
    missing = sorted(set(required) - document.keys())
    if missing:
        raise _ManifestProblemError(f"field(s) missing: {missing}")
    unknown = sorted(document.keys() - set(required) - set(optional))
    if unknown:
        raise _ManifestProblemError(f"unknown field(s): {unknown}")


def _natural(value: Any, what: str) -> int:
    # bool is an int subclass in Python; true is not a step
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _ManifestProblemError(f"{what} is {value!r}; accepted: a whole number >= 0")
    return value


def _number(value: Any, what: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise _ManifestProblemError(f"{what} is {value!r}; accepted: a number")
    return float(value)


def _shards(value: Any, step: int) -> tuple[ShardRecord, ...]:
    if not isinstance(value, list) or not value:
        raise _ManifestProblemError(
            f"shards is {value!r}; accepted: a non-empty list of shard records"
        )
    records = tuple(_shard(item, step) for item in value)
    for what, values in (("name", [r.name for r in records]), ("key", [r.key for r in records])):
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            raise _ManifestProblemError(
                f"the same shard {what} is listed more than once: {repeated}"
            )
    return records


def _shard(item: Any, step: int) -> ShardRecord:
    if not isinstance(item, dict):
        raise _ManifestProblemError(f"a shard record is {item!r}; accepted: an object")
    _check_record_fields(item)
    name, key, sha256 = item["name"], item["key"], item["sha256"]
    if not isinstance(name, str) or not isinstance(key, str) or not isinstance(sha256, str):
        raise _ManifestProblemError(f"shard record {item!r}: name, key and sha256 must be strings")
    problem = shard_name_problem(name)
    if problem:
        raise _ManifestProblemError(problem)
    try:
        check_key(key)
    except UnsafeKeyError as exc:
        raise _ManifestProblemError(f"shard {name!r}: {exc}") from None
    if not key.startswith(f"{step_prefix(step)}/"):
        raise _ManifestProblemError(
            f"shard {name!r} has key {key!r}, outside its own {step_prefix(step)}/"
        )
    if key != shard_key(step, name):
        raise _ManifestProblemError(
            f"shard {name!r} has key {key!r}; its key is {shard_key(step, name)!r}"
        )
    if not _SHA256.match(sha256):
        raise _ManifestProblemError(
            f"shard {name!r} has sha256 {sha256!r}; accepted: 64 lowercase hex digits"
        )
    return ShardRecord(name, key, sha256, _natural(item["size"], f"shard {name!r}: size"))


def _check_record_fields(item: Mapping[str, Any]) -> None:
    missing = sorted(_SHARD_FIELDS - item.keys())
    unknown = sorted(item.keys() - _SHARD_FIELDS)
    accepted = f"accepted: exactly {sorted(_SHARD_FIELDS)}"
    if missing:
        raise _ManifestProblemError(f"shard record {item!r} lacks {missing}; {accepted}")
    if unknown:
        raise _ManifestProblemError(f"shard record {item!r} has unknown {unknown}; {accepted}")


def _metrics(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        raise _ManifestProblemError(f"metrics is {value!r}; accepted: an object of numbers")
    return {name: _number(number, f"metric {name!r}") for name, number in value.items()}


def _check_expected_shards(value: Any, names: list[str]) -> None:
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise _ManifestProblemError(
            f"expected_shards is {value!r}; accepted: a list of shard names"
        )
    if len(set(value)) != len(value) or sorted(value) != sorted(names):
        raise _ManifestProblemError(
            f"incomplete or inconsistent: it expects shards {sorted(value)} "
            f"and lists {sorted(names)}"
        )


def _world_size(value: Any, meta: Mapping[str, Any]) -> int | None:
    if value is None:
        return None
    world_size = _natural(value, "world_size")
    if world_size < 1:
        raise _ManifestProblemError("world_size is 0; accepted: null or a whole number >= 1")
    if "world_size" in meta and meta["world_size"] != world_size:
        raise _ManifestProblemError(
            f"world_size is {world_size} but meta world_size is {meta['world_size']!r}"
        )
    return world_size


def _v1_world_size(meta: Mapping[str, Any]) -> int | None:
    if "world_size" not in meta:
        return None
    world_size = _natural(meta["world_size"], "meta world_size")
    if world_size < 1:
        raise _ManifestProblemError("meta world_size is 0; accepted: a whole number >= 1")
    return world_size


def shard_name_problem(name: str) -> str:
    """Why ``name`` cannot name a shard, or ``""``: a plain file name other than the manifest's."""
    if not name or "/" in name or name in (".", "..", MANIFEST_NAME):
        return f"shard name {name!r}: a plain file name other than {MANIFEST_NAME} is accepted"
    try:
        check_key(name)
    except UnsafeKeyError as exc:
        return f"shard name {name!r}: {exc}"
    return ""


def gang_layout_problem(names: Collection[str], world_size: int) -> str:
    """Why shards ``names`` are not a complete checkpoint of ``world_size`` ranks, or ``""``."""
    missing = [name for name in gang_shard_names(world_size) if name not in names]
    beyond = sorted(
        name
        for name in names
        if (match := _RANK_SHARD.match(name)) and int(match.group(1)) >= world_size
    )
    if missing:
        return f"incomplete: a checkpoint of {world_size} rank(s) lacks shard(s) {missing}"
    if beyond:
        return f"shard(s) {beyond} of ranks beyond its world size {world_size}"
    return ""


def sha256_file(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size
