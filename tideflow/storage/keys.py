"""Object keys are validated before any IO: a key may never leave its prefix.

Free-form ids (DAG run ids, step names) are made safe here too: as a key segment
(``safe_segment``, ``unique_segment``) and as a Kubernetes name or label value
(``dns_label``).
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import unquote

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


class UnsafeKeyError(ValueError):
    """A key tried to escape the store's prefix or switch to another store."""


def check_key(key: str) -> str:
    """Return ``key`` if it is a safe relative key, else raise ``UnsafeKeyError``.

    Rejected: empty keys, absolute paths, ``..`` and ``.`` segments, backslashes,
    URL-encoded separators or dots (``%2f``, ``%5c``, ``%2e``), NUL, and anything
    that looks like a URI scheme (``s3:``, ``file:``) so a key cannot switch stores.
    """
    problems = []
    decoded = unquote(key)
    if not key or key.strip() != key:
        problems.append("empty or padded with whitespace")
    if "\\" in key or "\\" in decoded:
        problems.append("contains a backslash")
    if decoded != key:
        problems.append("contains URL-encoded characters")
    if "\x00" in decoded:
        problems.append("contains NUL")
    if key.startswith("/"):
        problems.append("is absolute")
    if _SCHEME.match(key):
        problems.append("starts with a URI scheme")
    segments = key.split("/")
    if any(seg in ("", ".", "..") for seg in segments):
        problems.append("has an empty, '.' or '..' segment")
    if problems:
        raise UnsafeKeyError(
            f"unsafe object key {key!r}: {', '.join(problems)}; "
            "accepted: relative keys of '/'-separated names such as 'run-1/ckpt/shard-0.pt'"
        )
    return key


_UNSAFE_SEGMENT = re.compile(r"[^A-Za-z0-9._-]+")


def safe_segment(text: str) -> str:
    """Make an arbitrary id (an Airflow run id, say) usable as one key segment."""
    cleaned = _UNSAFE_SEGMENT.sub("_", text).strip("._") or "_"
    return cleaned[:200]


def unique_segment(text: str, digest_chars: int = 10) -> str:
    """A readable key segment for ``text`` that two different texts never share.

    ``safe_segment`` is lossy ("a/b" and "a_b" give the same); a short hash of the
    original keeps them apart.
    """
    digest = hashlib.sha256(text.encode()).hexdigest()[:digest_chars]
    return f"{safe_segment(text)[:80]}-{digest}"


def dns_label(*parts: str, limit: int = 63) -> str:
    """A DNS-1123 label: lowercase alphanumerics and '-', at most ``limit`` characters.

    Long or lossy names keep a short hash of the original, so two different
    inputs never collapse into one name. It starts and ends with an alphanumeric, as
    a label value and an object name must: an id with no letter or digit ("__", a
    possible Airflow run id) is its hash alone.
    """
    raw = "-".join(parts)
    name = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)
    if name == raw and len(name) <= limit:
        return name or hashlib.sha256(raw.encode()).hexdigest()[:8]
    digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
    stem = name[: limit - 9].rstrip("-")
    return f"{stem}-{digest}" if stem else digest
