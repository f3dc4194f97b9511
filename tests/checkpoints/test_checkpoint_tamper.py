"""Tampered checkpoints are refused, on disk and on a real S3-compatible server.

Each case writes two real gang checkpoints (two ranks, through the runtime's
``AsyncCheckpointer``), damages the newer one in one way, and checks every
path that reads checkpoints: ``latest()`` and resume fall back to the older
one, loading the damaged step by name fails with a reason, and retention keeps
the valid one even when asked to keep a single checkpoint.

Every tamper runs on disk. On S3 run the tampers an object store may answer
differently from a file system (``ON_OBJECTS``: an object missing, empty, cut,
changed or copied, a key of another step or one that climbs out with ``..``); an
edit of the manifest's JSON reads back the same from both.

Manifest edits marked "resealed" recompute the manifest's digest of its own
body, so the edit is caught by the structural check it targets and not merely
by the digest. The digest is computed here from its specification (SHA-256 of
the canonical JSON of every field but ``body_sha256``), independently of the
code under test.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from tideflow.checkpoint import CheckpointError, CheckpointManager
from tideflow.runtime.checkpointing import AsyncCheckpointer
from tideflow.runtime.distributed import DistInfo
from tideflow.steps.entrypoints import StepError
from tideflow.steps.evaluation import find_checkpoint
from tideflow.storage import Store

OLD, NEW = 1, 2
WORLD_SIZE = 2


def step_dir(step: int) -> str:
    return f"step-{step:012d}"


def manifest_key(step: int) -> str:
    return f"{step_dir(step)}/MANIFEST.json"


def body_digest(document: dict[str, Any]) -> str:
    body = {k: v for k, v in document.items() if k != "body_sha256"}
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


# -- building real gang checkpoints ---------------------------------------------------


def rank(manager: CheckpointManager, number: int) -> AsyncCheckpointer:
    dist = DistInfo(number, WORLD_SIZE, number, torch.device("cpu"), None, False)
    return AsyncCheckpointer(manager, dist)


def save_gang_checkpoint(uri: str, step: int) -> None:
    """Both ranks save ``step`` as a training gang does: rank 1 first, rank 0 commits."""
    manager = CheckpointManager(uri, keep_last=5)
    for number in (1, 0):
        weights = torch.full((4, 4), float(step))
        rank(manager, number).save(
            step,
            {"model": {"w": weights}, "step": step},
            rank_state={"rng": torch.tensor([step * 10 + number])},
            metrics={"loss": 1.0 / step},
            meta={"epoch": step},
            block=True,
        )


# -- the tampering ----------------------------------------------------------------------


@dataclass(frozen=True)
class Tamper:
    name: str
    apply: Callable[[Store], None]
    # A damaged shard (or a resealed record that disagrees with its shard) leaves
    # the manifest well formed: the checkpoint still counts as committed, and
    # only verification of its shards refuses it.
    caught_by_verification: bool = False


def read_manifest(store: Store, step: int = NEW) -> dict[str, Any]:
    document = json.loads(store.get_bytes(manifest_key(step)))
    assert isinstance(document, dict)
    return document


def write_manifest_bytes(store: Store, data: bytes) -> None:
    store.put_bytes(manifest_key(NEW), data)


def edit_manifest(
    edit: Callable[[dict[str, Any]], None], *, reseal: bool
) -> Callable[[Store], None]:
    def apply(store: Store) -> None:
        document = read_manifest(store)
        edit(document)
        if reseal and "body_sha256" in document:
            document["body_sha256"] = body_digest(document)
        write_manifest_bytes(store, json.dumps(document, sort_keys=True, indent=1).encode())

    return apply


def shard_record(document: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in document["shards"] if r["name"] == name)


def drop_shard(name: str, *, everywhere: bool) -> Callable[[dict[str, Any]], None]:
    def edit(document: dict[str, Any]) -> None:
        document["shards"] = [r for r in document["shards"] if r["name"] != name]
        if everywhere and "expected_shards" in document:
            document["expected_shards"] = [n for n in document["expected_shards"] if n != name]

    return edit


def no_shards(document: dict[str, Any]) -> None:
    document["shards"] = []
    if "expected_shards" in document:
        document["expected_shards"] = []


def shrink_world(document: dict[str, Any]) -> None:
    document["meta"]["world_size"] = 1
    if "world_size" in document:
        document["world_size"] = 1


def borrow_old_model_shard(store: Store, key: str) -> Callable[[dict[str, Any]], None]:
    """Point model.pt at ``key`` carrying the old step's real checksum and size."""

    def edit(document: dict[str, Any]) -> None:
        old = shard_record(read_manifest(store, OLD), "model.pt")
        shard_record(document, "model.pt").update(key=key, sha256=old["sha256"], size=old["size"])

    return edit


def share_rank_0_key(document: dict[str, Any]) -> None:
    rank_0 = shard_record(document, "rank-0.pt")
    shard_record(document, "rank-1.pt").update(
        key=rank_0["key"], sha256=rank_0["sha256"], size=rank_0["size"]
    )


def set_field(path: tuple[str, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(document: dict[str, Any]) -> None:
        target = document
        for part in path[:-1]:
            target = shard_record(target, part) if part.endswith(".pt") else target[part]
        target[path[-1]] = value

    return edit


def delete_field(path: tuple[str, ...]) -> Callable[[dict[str, Any]], None]:
    def edit(document: dict[str, Any]) -> None:
        target = document
        for part in path[:-1]:
            target = shard_record(target, part) if part.endswith(".pt") else target[part]
        target.pop(path[-1], None)

    return edit


def both(*edits: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def edit(document: dict[str, Any]) -> None:
        for one in edits:
            one(document)

    return edit


def on_store(make: Callable[[Store], Callable[[dict[str, Any]], None]]) -> Callable[[Store], None]:
    """A resealed edit that needs to read the store (the old step's records) first."""

    def apply(store: Store) -> None:
        edit_manifest(make(store), reseal=True)(store)

    return apply


def shard_bytes(transform: Callable[[bytes], bytes], name: str) -> Callable[[Store], None]:
    def apply(store: Store) -> None:
        key = f"{step_dir(NEW)}/{name}"
        store.put_bytes(key, transform(store.get_bytes(key)))

    return apply


def flip_a_bit(data: bytes) -> bytes:
    damaged = bytearray(data)
    damaged[len(damaged) // 2] ^= 0x01
    return bytes(damaged)


def copy_object(source: str, target: str) -> Callable[[Store], None]:
    def apply(store: Store) -> None:
        store.put_bytes(target, store.get_bytes(source))

    return apply


def delete_object(key: str) -> Callable[[Store], None]:
    def apply(store: Store) -> None:
        store.delete(key)

    return apply


metric_edited = set_field(("metrics", "loss"), 0.001)

TAMPERS = [
    # the manifest's bytes
    Tamper(
        "manifest_truncated",
        lambda s: write_manifest_bytes(s, s.get_bytes(manifest_key(NEW))[:200]),
    ),
    Tamper("manifest_empty", lambda s: write_manifest_bytes(s, b"")),
    Tamper("manifest_not_utf8", lambda s: write_manifest_bytes(s, b"\xff\xfe{\x00}")),
    Tamper("manifest_is_a_json_array", lambda s: write_manifest_bytes(s, b'[{"step": 2}]')),
    Tamper("manifest_is_json_null", lambda s: write_manifest_bytes(s, b"null")),
    Tamper("manifest_copied_from_older_step", copy_object(manifest_key(OLD), manifest_key(NEW))),
    Tamper("manifest_deleted", delete_object(manifest_key(NEW))),
    # edits the digest of the manifest's own body must catch
    Tamper("metric_edited", edit_manifest(metric_edited, reseal=False)),
    Tamper("metric_added", edit_manifest(set_field(("metrics", "accuracy"), 1.0), reseal=False)),
    Tamper("meta_edited", edit_manifest(set_field(("meta", "epoch"), 99), reseal=False)),
    Tamper("created_at_edited", edit_manifest(set_field(("created_at",), 1.0), reseal=False)),
    Tamper(
        "metric_edited_digest_removed",
        edit_manifest(both(metric_edited, delete_field(("body_sha256",))), reseal=False),
    ),
    Tamper(
        "metric_edited_digest_garbled",
        edit_manifest(both(metric_edited, set_field(("body_sha256",), "0" * 64)), reseal=False),
    ),
    Tamper(
        "metric_edited_relabelled_v1",
        edit_manifest(
            both(metric_edited, set_field(("format",), "tideflow-checkpoint/v1")), reseal=False
        ),
    ),
    # structural edits, resealed
    Tamper("step_differs_from_directory", edit_manifest(set_field(("step",), 999999), reseal=True)),
    Tamper("step_is_a_string", edit_manifest(set_field(("step",), "2"), reseal=True)),
    Tamper("step_missing", edit_manifest(delete_field(("step",)), reseal=True)),
    Tamper(
        "format_unknown",
        edit_manifest(set_field(("format",), "tideflow-checkpoint/v9"), reseal=True),
    ),
    Tamper("unknown_field_added", edit_manifest(set_field(("signed_by",), "me"), reseal=True)),
    Tamper("no_shards", edit_manifest(no_shards, reseal=True)),
    Tamper(
        "rank_shard_unlisted", edit_manifest(drop_shard("rank-1.pt", everywhere=False), reseal=True)
    ),
    Tamper(
        "rank_shard_unlisted_everywhere",
        edit_manifest(drop_shard("rank-1.pt", everywhere=True), reseal=True),
    ),
    Tamper(
        "model_shard_unlisted_everywhere",
        edit_manifest(drop_shard("model.pt", everywhere=True), reseal=True),
    ),
    Tamper("world_size_shrunk", edit_manifest(shrink_world, reseal=True)),
    Tamper(
        "shard_key_in_another_step",
        on_store(lambda s: borrow_old_model_shard(s, f"{step_dir(OLD)}/model.pt")),
    ),
    Tamper(
        "shard_key_escapes_with_dotdot",
        on_store(
            lambda s: borrow_old_model_shard(s, f"{step_dir(NEW)}/../{step_dir(OLD)}/model.pt")
        ),
    ),
    Tamper("two_shards_share_a_key", edit_manifest(share_rank_0_key, reseal=True)),
    Tamper(
        "duplicate_shard_name",
        edit_manifest(lambda d: d["shards"].append(dict(d["shards"][0])), reseal=True),
    ),
    Tamper(
        "shard_size_is_a_string",
        edit_manifest(
            lambda d: shard_record(d, "model.pt").update(
                size=str(shard_record(d, "model.pt")["size"])
            ),
            reseal=True,
        ),
    ),
    Tamper(
        "shard_size_wrong",
        edit_manifest(
            lambda d: shard_record(d, "model.pt").update(
                size=shard_record(d, "model.pt")["size"] + 1
            ),
            reseal=True,
        ),
        caught_by_verification=True,
    ),
    Tamper(
        "shard_sha256_malformed",
        edit_manifest(set_field(("model.pt", "sha256"), "not-a-digest"), reseal=True),
    ),
    Tamper(
        "shard_record_missing_field",
        edit_manifest(delete_field(("rank-0.pt", "sha256")), reseal=True),
    ),
    Tamper(
        "shard_record_extra_field",
        edit_manifest(set_field(("rank-0.pt", "url"), "https://elsewhere/x"), reseal=True),
    ),
    Tamper(
        "metric_is_a_numeric_string",
        edit_manifest(set_field(("metrics", "loss"), "0.5"), reseal=True),
    ),
    Tamper("metric_is_a_bool", edit_manifest(set_field(("metrics", "loss"), True), reseal=True)),
    Tamper("meta_is_a_list", edit_manifest(set_field(("meta",), [["epoch", 2]]), reseal=True)),
    # the shards
    Tamper("shard_truncated", shard_bytes(lambda b: b[: len(b) // 2], "rank-1.pt"), True),
    Tamper("shard_bit_flipped", shard_bytes(flip_a_bit, "model.pt"), True),
    Tamper("shard_emptied", shard_bytes(lambda b: b"", "rank-0.pt"), True),
    Tamper("shard_deleted", delete_object(f"{step_dir(NEW)}/rank-0.pt"), True),
    Tamper(
        "shard_replaced_by_older_step",
        copy_object(f"{step_dir(OLD)}/model.pt", f"{step_dir(NEW)}/model.pt"),
        True,
    ),
]


ON_OBJECTS = frozenset(
    {
        "manifest_truncated",
        "manifest_empty",
        "manifest_not_utf8",
        "manifest_copied_from_older_step",
        "manifest_deleted",
        "shard_key_in_another_step",
        "shard_key_escapes_with_dotdot",
        "shard_size_wrong",
        "shard_truncated",
        "shard_bit_flipped",
        "shard_emptied",
        "shard_deleted",
        "shard_replaced_by_older_step",
    }
)
# The s3 store starts the session's SeaweedFS: those tests are in the servers tier.
CASES = [
    *(pytest.param(("file", t), id=f"file-{t.name}") for t in TAMPERS),
    *(
        pytest.param(("s3", t), id=f"s3-{t.name}", marks=pytest.mark.servers)
        for t in TAMPERS
        if t.name in ON_OBJECTS
    ),
]


@pytest.fixture(params=CASES)
def case(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Tamper]:
    """(a new store's URI, the tamper)."""
    store, tamper = request.param
    if store == "file":
        return (tmp_path / "checkpoints").as_uri(), tamper
    request.getfixturevalue("s3_endpoint")  # the real SeaweedFS server of the session
    return f"s3://tideflow/tests/tamper/{uuid.uuid4().hex}", tamper


@pytest.fixture
def tamper(case: tuple[str, Tamper]) -> Tamper:
    return case[1]


@pytest.fixture
def tampered(case: tuple[str, Tamper]) -> tuple[str, str]:
    """(store URI, checksum of the old step's manifest) after tampering with the new step."""
    store_uri, tamper = case
    save_gang_checkpoint(store_uri, OLD)
    save_gang_checkpoint(store_uri, NEW)
    manager = CheckpointManager(store_uri)
    newest = manager.latest()
    assert newest is not None and newest.step == NEW, "the untampered checkpoints must be valid"
    old_checksum = hashlib.sha256(manager.store.get_bytes(manifest_key(OLD))).hexdigest()
    tamper.apply(manager.store)
    return store_uri, old_checksum


def test_the_tamper_kinds_are_distinct_and_enough() -> None:
    names = [tamper.name for tamper in TAMPERS]
    assert len(set(names)) == len(names) >= 26
    assert set(names) >= ON_OBJECTS


def test_latest_and_resume_fall_back_to_the_older_valid_checkpoint(
    tampered: tuple[str, str], tamper: Tamper
) -> None:
    uri, old_checksum = tampered
    manager = CheckpointManager(uri)
    latest = manager.latest()
    assert latest is not None and (latest.step, latest.checksum) == (OLD, old_checksum)
    if not tamper.caught_by_verification:
        assert [m.step for m in manager.committed()] == [OLD]
    for number in range(WORLD_SIZE):
        resumed = rank(manager, number).load_latest()
        assert resumed is not None
        step, shared, mine = resumed
        assert step == OLD and shared["step"] == OLD
        assert torch.equal(shared["model"]["w"], torch.full((4, 4), float(OLD)))
        assert torch.equal(mine["rng"], torch.tensor([OLD * 10 + number]))
    assert find_checkpoint(uri)["checkpoint_step"] == OLD


def test_loading_the_tampered_step_by_name_fails_with_the_reason(
    tampered: tuple[str, str],
) -> None:
    uri, _ = tampered
    with pytest.raises(CheckpointError, match=f"step {NEW}"):
        CheckpointManager(uri).load(NEW)
    with pytest.raises(StepError, match=f"step {NEW}"):
        find_checkpoint(uri, NEW)


def test_retention_never_deletes_the_newest_valid_checkpoint(tampered: tuple[str, str]) -> None:
    uri, old_checksum = tampered
    CheckpointManager(uri, keep_last=1).apply_retention()
    manager = CheckpointManager(uri)
    latest = manager.latest()
    assert latest is not None and (latest.step, latest.checksum) == (OLD, old_checksum)


def test_resume_skips_a_newer_checkpoint_without_the_shards_it_loads(tmp_path: Path) -> None:
    """A checkpoint no gang wrote (no world size) is valid, but no gang can resume from it."""
    uri = (tmp_path / "checkpoints").as_uri()
    save_gang_checkpoint(uri, OLD)
    manager = CheckpointManager(uri)
    manager.save(NEW, {"rank-0.pt": b"no model here"})
    resumed = rank(manager, 0).load_latest()
    assert resumed is not None and resumed[0] == OLD
