"""Artifact and checkpoint stores addressed by URI: ``file:///dir`` or ``s3://bucket/prefix``.

boto3 reads the S3 endpoint and credentials from its usual sources
(``AWS_ENDPOINT_URL_S3``, ``AWS_ACCESS_KEY_ID``, instance roles, IRSA), so
S3-compatible servers need no code here. boto3 is imported only when an S3
store is used: DAG parsing never pays for it.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from tideflow.storage.keys import UnsafeKeyError, check_key

log = logging.getLogger(__name__)


class Store(Protocol):
    uri: str

    def url(self, key: str) -> str: ...
    def put_bytes(self, key: str, data: bytes) -> str: ...
    def put_file(self, key: str, path: Path) -> str: ...
    def put_bytes_if_absent(self, key: str, data: bytes) -> bool: ...
    def get_bytes(self, key: str) -> bytes: ...
    def get_file(self, key: str, path: Path) -> None: ...
    def exists(self, key: str) -> bool: ...
    def list(self, prefix: str = "") -> list[str]: ...
    def delete(self, key: str) -> None: ...


class FileStore:
    """A directory; writes go to a temporary file first and are renamed into place.

    Every key is resolved (links followed) before it is read, written, listed
    or deleted, and refused with ``UnsafeKeyError`` if it lands outside the
    root: a link inside the root cannot lead the store to files it does not
    own. Links that stay inside the root, and a root that is itself a link,
    work as usual. The check is made at each call; it does not guard against
    someone who swaps links inside the root while a call runs.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.uri = root.as_uri()

    def _path(self, key: str) -> Path:
        """Where ``key`` really is: inside the root, or ``UnsafeKeyError``."""
        return self._inside_root(self.root / check_key(key), key)

    def _inside_root(self, path: Path, key: str) -> Path:
        real_root = self.root.resolve()
        try:
            real = path.resolve()
        except (OSError, RuntimeError) as exc:  # a link loop (RuntimeError before 3.13)
            raise UnsafeKeyError(
                f"object key {key!r} cannot be resolved inside the store root {self.root}: {exc}"
            ) from exc
        if not real.is_relative_to(real_root):
            raise UnsafeKeyError(
                f"object key {key!r} resolves to {real}, outside the store root {self.root}; "
                "a file store never follows a link out of its root"
            )
        return real

    def url(self, key: str) -> str:
        return (self.root / check_key(key)).as_uri()

    def _staged(self, key: str, write: Callable[[str], object]) -> tuple[Path, str]:
        """Write a hidden temporary file beside the key's final name; fsync it."""
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        os.close(fd)
        try:
            write(tmp)
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target, tmp

    def put_bytes(self, key: str, data: bytes) -> str:
        target, tmp = self._staged(key, lambda tmp: Path(tmp).write_bytes(data))
        os.replace(tmp, target)  # readers see the old object or the new one, never a part
        return self.url(key)

    def put_bytes_if_absent(self, key: str, data: bytes) -> bool:
        """Create-only write: False, and nothing changed, if the key already exists.

        The data is staged in a temporary file and hard-linked into place;
        link() fails if the name exists, so two writers can never both win.
        """
        target, tmp = self._staged(key, lambda tmp: Path(tmp).write_bytes(data))
        try:
            os.link(tmp, target)
        except FileExistsError:
            return False
        finally:
            Path(tmp).unlink(missing_ok=True)
        return True

    def put_file(self, key: str, path: Path) -> str:
        target, tmp = self._staged(key, lambda tmp: shutil.copyfile(path, tmp))
        os.replace(tmp, target)
        return self.url(key)

    def get_bytes(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def get_file(self, key: str, path: Path) -> None:
        shutil.copyfile(self._path(key), path)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        """Keys under ``prefix``, sorted; hidden (staged) files are not objects.

        Linked directories are not descended into, and a linked file that
        resolves outside the root is left out, with a warning.
        """
        clean = prefix.rstrip("/")
        base = self._path(clean) if clean else self.root.resolve()
        if not base.is_dir():
            return []
        keys = []
        for directory, _, files in os.walk(base):  # does not follow linked directories
            for name in files:
                path = Path(directory) / name
                relative = path.relative_to(base).as_posix()
                key = f"{clean}/{relative}" if clean else relative
                if not name.startswith(".") and self._listable(key, path):
                    keys.append(key)
        return sorted(keys)

    def _listable(self, key: str, path: Path) -> bool:
        # Only a link can lead out: the walk starts inside the root and enters no linked directory.
        if path.is_symlink():
            try:
                self._path(key)
            except UnsafeKeyError as exc:
                log.warning("tideflow: not listing %s: %s", key, exc)
                return False
        return path.is_file()

    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        # Object stores have no directories; do not leave empty ones behind either.
        real_root = self.root.resolve()
        for parent in path.parents:
            if parent == real_root or not parent.is_relative_to(real_root):
                break
            try:
                parent.rmdir()
            except OSError:
                break


class S3Store:
    """A bucket and prefix; large files go through boto3's managed (multipart) transfer."""

    def __init__(self, bucket: str, prefix: str, client: Any | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.client("s3")
        return self._client

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    def put_bytes(self, key: str, data: bytes) -> str:
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
        return self.url(key)

    def put_bytes_if_absent(self, key: str, data: bytes) -> bool:
        """Create-only write through S3 conditional writes (``If-None-Match: *``).

        A server that ignores the header would overwrite; a HEAD first narrows
        that window for such servers, and the manifest content check done by
        callers catches the rest.
        """
        from botocore.exceptions import ClientError

        if self.exists(key):
            return False
        try:
            self.client.put_object(
                Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*"
            )
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                return False
            raise
        return True

    def put_file(self, key: str, path: Path) -> str:
        from boto3.s3.transfer import TransferConfig

        # boto3's transfer manager: multipart above the threshold, parts in parallel
        config = TransferConfig(
            multipart_threshold=64 * 1024 * 1024,
            multipart_chunksize=64 * 1024 * 1024,
            max_concurrency=8,
        )
        self.client.upload_file(str(path), self.bucket, self._key(key), Config=config)
        return self.url(key)

    def get_bytes(self, key: str) -> bytes:
        body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
        return bytes(body.read())

    def get_file(self, key: str, path: Path) -> None:
        self.client.download_file(self.bucket, self._key(key), str(path))

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    def list(self, prefix: str = "") -> list[str]:
        full = (
            self._key(prefix.rstrip("/")) + "/"
            if prefix
            else (f"{self.prefix}/" if self.prefix else "")
        )
        keys: list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
            for item in page.get("Contents", []):
                key = str(item["Key"])
                keys.append(key[len(self.prefix) + 1 :] if self.prefix else key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))


def open_store(uri: str) -> Store:
    """``file:///abs/dir`` or ``s3://bucket/prefix`` -> a store rooted there."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"store URI {uri!r}: file URIs take no host; use file:///abs/path")
        return FileStore(Path(parsed.path))
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"store URI {uri!r} has no bucket; use s3://bucket/prefix")
        return S3Store(parsed.netloc, parsed.path)
    raise ValueError(f"store URI {uri!r}: unsupported scheme; accepted: file:// or s3://")
