"""Checkpoints: commit protocol, verification, retention, and crash consistency under kill -9."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tideflow.checkpoint import (
    CheckpointError,
    CheckpointManager,
    CorruptCheckpointError,
)
from tideflow.storage import UnsafeKeyError

WRITER = str(Path(__file__).parents[1] / "checkpoint_writer.py")


def manager(root: Path, **kwargs: object) -> CheckpointManager:
    return CheckpointManager(root.as_uri(), **kwargs)  # type: ignore[arg-type]


def test_save_latest_and_read_back(tmp_path: Path) -> None:
    checkpoints = manager(tmp_path)
    assert checkpoints.latest() is None
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(3_000_000))
    first = checkpoints.save(
        10, {"model.pt": b"weights-10", "optim.pt": big}, metrics={"loss": 0.5}, meta={"epoch": 1}
    )
    checkpoints.save(20, {"model.pt": b"weights-20"}, metrics={"loss": 0.4})
    latest = checkpoints.latest()
    assert latest is not None and latest.step == 20
    assert checkpoints.read_shard(latest, "model.pt") == b"weights-20"
    assert first.meta == {"epoch": 1} and first.metrics == {"loss": 0.5}
    out = tmp_path / "out.bin"
    checkpoints.download_shard(first, "optim.pt", out)
    assert out.read_bytes() == big.read_bytes()
    assert len(first.checksum) == 64 and first.uri.endswith("step-000000000010/MANIFEST.json")


def test_recommit_is_idempotent_but_never_replaces(tmp_path: Path) -> None:
    checkpoints = manager(tmp_path)
    record = checkpoints.write_shard(5, "model.pt", b"a")
    first = checkpoints.commit(5, [record])
    assert checkpoints.commit(5, [record]).checksum == first.checksum
    other = checkpoints.write_shard(5, "other.pt", b"b")
    with pytest.raises(CheckpointError, match="already committed with different shards"):
        checkpoints.commit(5, [record, other])


def test_shards_without_manifest_are_not_a_checkpoint(tmp_path: Path) -> None:
    checkpoints = manager(tmp_path)
    checkpoints.save(1, {"model.pt": b"one"})
    checkpoints.write_shard(2, "model.pt", b"two")  # crashed before committing
    latest = checkpoints.latest()
    assert latest is not None and latest.step == 1


@pytest.mark.parametrize("damage", ["truncate", "bitflip", "delete"])
def test_damaged_shard_is_detected_and_skipped(tmp_path: Path, damage: str) -> None:
    checkpoints = manager(tmp_path)
    checkpoints.save(1, {"model.pt": b"good" * 1000})
    bad = checkpoints.save(2, {"model.pt": b"soon-damaged" * 1000})
    shard = tmp_path / bad.shard("model.pt").key
    if damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:100])
    elif damage == "bitflip":
        data = bytearray(shard.read_bytes())
        data[500] ^= 0x01
        shard.write_bytes(bytes(data))
    else:
        shard.unlink()
    assert checkpoints.verify(bad)
    latest = checkpoints.latest()
    assert latest is not None and latest.step == 1
    with pytest.raises(CorruptCheckpointError):
        checkpoints.read_shard(bad, "model.pt")


def test_retention_keeps_last_best_protected_and_marked(tmp_path: Path) -> None:
    checkpoints = manager(tmp_path, keep_last=2, keep_best=("val_loss", "min"))
    losses = {1: 0.9, 2: 0.1, 3: 0.5, 4: 0.6, 5: 0.7, 6: 0.8, 7: 0.95}
    for step, loss in losses.items():
        checkpoints.save(step, {"model.pt": str(step).encode()}, metrics={"val_loss": loss})
    checkpoints.mark(4, "last-good")
    checkpoints.write_shard(3, "orphan.pt", b"x")  # orphan shard beside a committed step
    checkpoints.write_shard(0, "model.pt", b"crashed")  # an uncommitted, older save
    deleted = checkpoints.apply_retention(protect=[3])
    assert deleted == [1, 5]
    assert [m.step for m in checkpoints.committed()] == [2, 3, 4, 6, 7]
    assert checkpoints.marked("last-good") == 4
    assert not (tmp_path / "step-000000000000").exists() or not list(
        (tmp_path / "step-000000000000").iterdir()
    )


def test_unsafe_shard_names_are_rejected(tmp_path: Path) -> None:
    checkpoints = manager(tmp_path)
    for name in ("../x", "a/b", "MANIFEST.json"):
        with pytest.raises(CheckpointError):
            checkpoints.write_shard(1, name, b"x")
    with pytest.raises(UnsafeKeyError):
        checkpoints.write_shard(1, "..", b"x")


def crash_trials(uri: str, trials: int, seed: int, check: CheckpointManager) -> int:
    rng = random.Random(seed)
    last_step = -1
    committed_seen = 0
    for trial in range(trials):
        child = subprocess.Popen(
            [sys.executable, WRITER, uri, str(trial)],
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.15))
        child.send_signal(signal.SIGKILL)
        child.wait()
        latest = check.latest()
        if latest is not None:
            assert check.verify(latest) == []
            assert latest.step >= last_step, "latest() went backwards"
            for record in latest.shards:
                assert len(check.read_shard(latest, record.name)) == record.size
            last_step = latest.step
            committed_seen += 1
    return committed_seen


@pytest.mark.processes
def test_kill_9_during_writes_never_exposes_a_torn_checkpoint(tmp_path: Path) -> None:
    uri = (tmp_path / "ckpt").as_uri()
    committed = crash_trials(uri, 100, seed=7, check=CheckpointManager(uri))
    assert committed > 50  # most kills land after at least one commit


@pytest.mark.processes
def test_s3_round_trip_multipart_and_crash_consistency(s3_endpoint: str) -> None:
    """Against the real SeaweedFS server started by the `s3_endpoint` fixture."""
    uri = "s3://tideflow/tests/checkpoints"
    checkpoints = CheckpointManager(uri, keep_last=2)
    payload = Path(os.environ.get("TMPDIR", "/tmp")) / f"shard-{os.getpid()}.bin"
    payload.write_bytes(os.urandom(70 * 1024 * 1024))  # above the 64 MB multipart threshold
    try:
        saved = checkpoints.save(1, {"model.pt": payload, "rank-0.pt": b"rng"})
    finally:
        payload.unlink()
    latest = checkpoints.latest()
    assert latest is not None and latest.checksum == saved.checksum
    assert latest.shard("model.pt").size == 70 * 1024 * 1024
    # create-only manifests on S3, through conditional writes
    assert checkpoints.store.put_bytes_if_absent("step-000000000001/MANIFEST.json", b"x") is False
    committed = crash_trials(
        "s3://tideflow/tests/crash",
        20,
        seed=3,
        check=CheckpointManager("s3://tideflow/tests/crash"),
    )
    assert committed > 5


def write_v1_manifest(
    root: Path, step: int, shards: dict[str, bytes], meta: dict[str, object]
) -> None:
    """A manifest exactly as the first format wrote it (no completeness record, no digest)."""
    prefix = f"step-{step:012d}"
    (root / prefix).mkdir(parents=True)
    records = []
    for name, data in sorted(shards.items()):
        (root / prefix / name).write_bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        records.append(
            {"name": name, "key": f"{prefix}/{name}", "sha256": digest, "size": len(data)}
        )
    document = {
        "format": "tideflow-checkpoint/v1",
        "step": step,
        "created_at": time.time(),
        "shards": records,
        "metrics": {"loss": 0.5},
        "meta": meta,
    }
    (root / prefix / "MANIFEST.json").write_text(json.dumps(document, sort_keys=True, indent=1))


def test_v1_manifests_are_still_read_and_held_to_the_gang_layout(tmp_path: Path) -> None:
    checkpoints = manager(tmp_path)
    gang = {"model.pt": b"m", "rank-0.pt": b"r0", "rank-1.pt": b"r1"}
    write_v1_manifest(tmp_path, 1, gang, {"world_size": 2})
    write_v1_manifest(tmp_path, 2, {"weights.bin": b"w"}, {})  # not written by a gang
    write_v1_manifest(tmp_path, 3, {"model.pt": b"m", "rank-0.pt": b"r0"}, {"world_size": 2})
    assert [m.step for m in checkpoints.committed()] == [1, 2]
    latest = checkpoints.latest()
    assert latest is not None and latest.step == 2 and latest.world_size is None
    assert checkpoints.load(1).world_size == 2
    with pytest.raises(CorruptCheckpointError, match=r"lacks shard\(s\) \['rank-1.pt'\]"):
        checkpoints.load(3)


def test_commit_never_writes_a_manifest_readers_would_refuse(tmp_path: Path) -> None:
    checkpoints = manager(tmp_path)
    model = checkpoints.write_shard(4, "model.pt", b"m")
    rank_0 = checkpoints.write_shard(4, "rank-0.pt", b"r0")
    elsewhere = checkpoints.write_shard(3, "rank-1.pt", b"r1")
    for shards, world_size, reason in [
        ([], None, "at least one shard"),
        ([model, rank_0], 2, r"lacks shard\(s\) \['rank-1.pt'\]"),
        ([model, rank_0, elsewhere], None, "not this step's"),
    ]:
        with pytest.raises(CheckpointError, match=reason):
            checkpoints.commit(4, shards, world_size=world_size)
    assert not (tmp_path / "step-000000000004" / "MANIFEST.json").exists()
    committed = checkpoints.commit(4, [model, rank_0], world_size=1)
    assert committed.world_size == 1 and checkpoints.load(4) == committed


def test_latest_names_the_reason_it_skips_a_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoints = manager(tmp_path)
    checkpoints.save(1, {"model.pt": b"one"}, metrics={"loss": 0.9})
    checkpoints.save(2, {"model.pt": b"two"}, metrics={"loss": 0.8})
    manifest = tmp_path / "step-000000000002" / "MANIFEST.json"
    manifest.write_text(manifest.read_text().replace("0.8", "0.1"))  # a better loss, by hand
    latest = checkpoints.latest()
    assert latest is not None and latest.step == 1
    assert "skipping checkpoint step 2" in caplog.text and "body_sha256" in caplog.text
    with pytest.raises(CorruptCheckpointError, match="edited after it was written"):
        checkpoints.load(2)
    with pytest.raises(CheckpointError, match="no committed checkpoint at step 7"):
        checkpoints.load(7)
