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


# -- a file store never follows a link out of its root -----------------------------------


@pytest.fixture
def linked_store(tmp_path: Path) -> tuple[FileStore, Path]:
    """A store whose root holds links out of it, and the outside directory they reach."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"not yours")
    (root / "linked-file").symlink_to(outside / "secret.txt")
    (root / "linked-dir").symlink_to(outside, target_is_directory=True)
    (root / "dangling").symlink_to(outside / "not-yet-there")
    (root / "loop-a").symlink_to(root / "loop-b")
    (root / "loop-b").symlink_to(root / "loop-a")
    return FileStore(root), outside


ESCAPING_KEYS = ["linked-file", "linked-dir/secret.txt", "dangling", "linked-dir/new/x.bin"]


def assert_refused(store: FileStore, key: str, excinfo: pytest.ExceptionInfo[Exception]) -> None:
    message = str(excinfo.value)
    assert "outside the store root" in message
    assert repr(key) in message and str(store.root) in message


def outside_tree(outside: Path) -> dict[str, bytes]:
    return {
        p.relative_to(outside).as_posix(): p.read_bytes() for p in outside.rglob("*") if p.is_file()
    }


@pytest.mark.parametrize("key", ESCAPING_KEYS)
def test_file_store_refuses_reads_through_a_link_out_of_its_root(
    linked_store: tuple[FileStore, Path], key: str, tmp_path: Path
) -> None:
    store, _ = linked_store
    for read in (
        lambda: store.get_bytes(key),
        lambda: store.get_file(key, tmp_path / "copy"),
        lambda: store.exists(key),
    ):
        with pytest.raises(UnsafeKeyError) as excinfo:
            read()
        assert_refused(store, key, excinfo)
    assert not (tmp_path / "copy").exists()


@pytest.mark.parametrize("key", ESCAPING_KEYS)
def test_file_store_refuses_writes_and_deletes_through_a_link_out_of_its_root(
    linked_store: tuple[FileStore, Path], key: str, tmp_path: Path
) -> None:
    store, outside = linked_store
    before = outside_tree(outside)
    source = tmp_path / "source.bin"
    source.write_bytes(b"overwritten")
    for change in (
        lambda: store.put_bytes(key, b"overwritten"),
        lambda: store.put_bytes_if_absent(key, b"overwritten"),
        lambda: store.put_file(key, source),
        lambda: store.delete(key),
    ):
        with pytest.raises(UnsafeKeyError) as excinfo:
            change()
        assert_refused(store, key, excinfo)
    assert outside_tree(outside) == before
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_file_store_refuses_a_symlink_loop_with_the_same_error(
    linked_store: tuple[FileStore, Path],
) -> None:
    store, _ = linked_store
    with pytest.raises(UnsafeKeyError) as excinfo:
        store.get_bytes("loop-a")
    assert repr("loop-a") in str(excinfo.value) and str(store.root) in str(excinfo.value)


def test_file_store_lists_nothing_that_resolves_outside_its_root(
    linked_store: tuple[FileStore, Path],
) -> None:
    store, _ = linked_store
    store.put_bytes("run/a.bin", b"inside")
    assert store.list() == ["run/a.bin"]
    with pytest.raises(UnsafeKeyError) as excinfo:
        store.list("linked-dir")
    assert_refused(store, "linked-dir", excinfo)


def test_file_store_follows_links_that_stay_inside_its_root(tmp_path: Path) -> None:
    real = tmp_path / "real-root"
    real.mkdir()
    (tmp_path / "root").symlink_to(real, target_is_directory=True)  # the root may be a link
    store = open_store((tmp_path / "root").as_uri())
    store.put_bytes("data/a.bin", b"inside")
    (real / "alias").symlink_to(real / "data", target_is_directory=True)
    assert store.get_bytes("alias/a.bin") == b"inside"
    assert store.exists("alias/a.bin")
    assert (real / "data" / "a.bin").read_bytes() == b"inside"
    assert store.list("data") == ["data/a.bin"]
