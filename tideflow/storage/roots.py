"""Which store roots a team's checkpoints may live under, and the gang's place in one.

A gang's checkpoint store is never a URI a pipeline names outright: retention
deletes old steps in that store, so a pipeline pointing its store at another
run's (or another team's) checkpoints could delete them. A pipeline may name
a *root* instead (``checkpoint.store``); the gang writes under
``<root>/<PIPELINE>/<RUN>/<STEP>/checkpoints`` and nowhere else. A root must
be the platform's artifact root or one the platform declares in
``TIDEFLOW_CHECKPOINT_ROOTS``: comma-separated URIs, each for every team, or
``team=URI`` for one team.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlparse

from tideflow.settings_registry import STORE_SCHEMES as SCHEMES


class StoreRootError(ValueError):
    """A checkpoint store root the platform does not allow for the team."""


def normalize(uri: str) -> str:
    """``uri`` without a trailing '/'; ValueError for a scheme or segment that could escape."""
    parsed = urlparse(uri)
    if parsed.scheme not in SCHEMES:
        raise ValueError(f"'{uri}' is not a file:// or s3:// URI")
    path = parsed.path.rstrip("/")
    if any(segment in (".", "..") for segment in path.split("/")):
        raise ValueError(f"'{uri}' has a '.' or '..' segment")
    return f"{parsed.scheme}://{parsed.netloc}{path}"


def is_within(uri: str, root: str) -> bool:
    """Whether ``uri`` is ``root`` or below it (by whole path segments)."""
    inner, outer = normalize(uri), normalize(root)
    return inner == outer or inner.startswith(outer + "/")


def declared_roots(declaration: str, team: str) -> tuple[str, ...]:
    """The roots ``TIDEFLOW_CHECKPOINT_ROOTS`` gives ``team``: shared ones and its own."""
    roots = []
    for entry in (part.strip() for part in declaration.split(",")):
        if not entry:
            continue
        owner, sep, uri = entry.partition("=")
        if not sep:
            roots.append(entry)
        elif owner.strip() == team:
            roots.append(uri.strip())
    return tuple(roots)


def team_roots(artifact_root: str, declaration: str, team: str) -> tuple[str, ...]:
    """Every root ``team``'s gangs may keep checkpoints under: the artifact root, and
    the roots ``TIDEFLOW_CHECKPOINT_ROOTS`` (``declaration``) gives it."""
    return (artifact_root, *declared_roots(declaration, team))


def check_root(root: str, team: str, allowed: Sequence[str]) -> None:
    """Raise ``StoreRootError`` with the reason unless ``root`` is within an allowed root."""
    try:
        normalize(root)
    except ValueError as exc:
        raise StoreRootError(f"checkpoint store {exc}") from None
    if not any(is_within(root, candidate) for candidate in allowed):
        raise StoreRootError(
            f"checkpoint store '{root}' is outside the roots team '{team}' may write "
            f"checkpoints to ({', '.join(allowed) or 'none'}); retention deletes inside a "
            "gang's store, so a store must be one the platform declares for the team "
            "(TIDEFLOW_CHECKPOINT_ROOTS) or left out"
        )


def gang_store(root: str | None, artifact_root: str, run_prefix: str) -> str:
    """The one store a gang writes and retains in: ``<root>/<run_prefix>/checkpoints``."""
    base = (root or artifact_root).rstrip("/")
    return f"{base}/{run_prefix}/checkpoints"
