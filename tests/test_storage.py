"""Stores addressed by URI, and the key checks that keep every key inside its prefix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tideflow.storage import FileStore, S3Store, UnsafeKeyError, check_key, open_store, safe_segment

UNSAFE = [
    "",
    " padded",
    "../escape",
    "a/../../b",
    "a/./b",
    "/abs/key",
    "a//b",
    "a/b/",
    "a\\b",
    "..\\x",
    "a%2f..%2fb",
    "%2e%2e/x",
    "a%5cb",
    "s3://other-bucket/key",
    "file:///etc/passwd",
    "nul\x00byte",
]


@pytest.mark.parametrize("key", UNSAFE)
def test_unsafe_keys_are_rejected_with_the_reason(key: str) -> None:
    with pytest.raises(UnsafeKeyError, match="unsafe object key"):
        check_key(key)


@pytest.mark.parametrize("key", ["a", "run-1/ckpt/shard-0.pt", "x/y.z/w_1", "a..b/c"])
def test_ordinary_keys_pass(key: str) -> None:
    assert check_key(key) == key


def test_safe_segment_turns_run_ids_into_one_segment() -> None:
    assert safe_segment("manual__2026-11-22T10:00:00+00:00") == "manual__2026-11-22T10_00_00_00_00"
    assert safe_segment("../..") == "_"
    check_key(safe_segment("a/b\\c"))


def test_file_store_round_trip_and_listing(tmp_path: Path) -> None:
    store = open_store((tmp_path / "root").as_uri())
    assert isinstance(store, FileStore)
    url = store.put_bytes("run/a.bin", b"hello")
    assert url == (tmp_path / "root" / "run" / "a.bin").as_uri()
    source = tmp_path / "src.bin"
    source.write_bytes(b"x" * 1000)
    store.put_file("run/b.bin", source)
    assert store.get_bytes("run/a.bin") == b"hello"
    assert store.list("run") == ["run/a.bin", "run/b.bin"]
    assert store.exists("run/b.bin") and not store.exists("run/c.bin")
    store.delete("run/a.bin")
    assert store.list() == ["run/b.bin"]
    with pytest.raises(UnsafeKeyError):
        store.put_bytes("../outside", b"no")
    assert not (tmp_path / "outside").exists()


def test_file_store_write_leaves_no_partial_file_on_failure(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    with pytest.raises(FileNotFoundError):
        store.put_file("k", tmp_path / "does-not-exist")
    assert list(tmp_path.iterdir()) == []


def test_open_store_parses_uris() -> None:
    s3 = open_store("s3://bucket/some/prefix/")
    assert isinstance(s3, S3Store) and (s3.bucket, s3.prefix) == ("bucket", "some/prefix")
    assert s3.url("k/v") == "s3://bucket/some/prefix/k/v"
    for bad, reason in [
        ("s3:///x", "no bucket"),
        ("gs://b/x", "unsupported scheme"),
        ("file://host/x", "take no host"),
    ]:
        with pytest.raises(ValueError, match=reason):
            open_store(bad)
