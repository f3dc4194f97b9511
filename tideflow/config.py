"""Platform settings read from the environment (12-factor: nothing in the YAML).

The same pipeline runs on a laptop and on a cluster; what differs (where
artifacts go, which MLflow server, which cluster inventory) is configuration.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


class ConfigError(ValueError):
    """A setting that cannot be used: an environment variable, a cluster file, a flag,
    a server it names. Its message names the setting, the value and what is accepted;
    the CLI prints it and exits 2, never with a traceback (a ValueError still, so that
    callers catching those keep working)."""


def bad_setting(name: str, value: str | None, accepted: str, why: str = "") -> ConfigError:
    """``NAME='value': why; accepted: ...`` (``NAME (unset)`` when it is not set)."""
    shown = f"{name} (unset)" if value is None else f"{name}={value!r}"
    return ConfigError(f"{shown}: {why + '; ' if why else ''}accepted: {accepted}")


def env_number(
    name: str,
    default: str | None,
    accepted: str,
    ok: Callable[[float], bool] = lambda _: True,
    *,
    whole: bool = False,
) -> float:
    """The environment variable ``name`` (``default`` when unset) as a finite number
    that ``ok`` accepts, a whole one when ``whole``; else ``ConfigError`` naming it."""
    text = os.environ.get(name, default)
    try:
        value = float(text) if text is not None else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or (whole and not value.is_integer()) or not ok(value):
        raise bad_setting(name, os.environ.get(name), accepted)
    return int(value) if whole else value


def _home() -> Path:
    text = os.environ.get("TIDEFLOW_HOME")
    home = Path(Path.cwd() / ".tideflow" if text is None else text).resolve()
    # the state files are made under it: a file on its path would fail there, later
    existing = next(p for p in (home, *home.parents) if p.exists())
    if not existing.is_dir():
        raise bad_setting(
            "TIDEFLOW_HOME",
            text,
            "a directory, or a path one can be made at",
            f"{existing} is a file",
        )
    return home


BACKENDS = ("local", "kubernetes")

# Where a gang worker's runtime records its training progress (the step it last
# reached): the supervisor reads it to tell a deterministic failure from a flaky one.
PROGRESS_FILE_ENV = "TIDEFLOW_PROGRESS_FILE"
# Seconds without progress after which a worker's runtime calls itself hung (exit 77).
HANG_TIMEOUT_ENV = "TIDEFLOW_HANG_TIMEOUT_S"
EXIT_HUNG = 77


def _backend() -> str:
    backend = os.environ.get("TIDEFLOW_BACKEND", "local")
    if backend not in BACKENDS:
        raise bad_setting("TIDEFLOW_BACKEND", backend, ", ".join(BACKENDS))
    return backend


@dataclass(frozen=True)
class Settings:
    home: Path
    pipelines_dir: Path
    cluster_file: Path | None
    artifact_root: str
    mlflow_tracking_uri: str | None
    # Where gang steps run: "local" (processes on this machine, the lease
    # ledger) or "kubernetes" (a Volcano Job or a Kueue JobSet; TIDEFLOW_K8S_*).
    backend: str = "local"
    # Store roots besides the artifact root that checkpoints may go under:
    # "s3://shared/ckpt,vision=s3://vision/ckpt" (tideflow.storage.roots).
    checkpoint_roots: str = ""

    @classmethod
    def from_env(cls) -> Settings:
        home = _home()
        cluster = os.environ.get("TIDEFLOW_CLUSTER_FILE")
        return cls(
            home=home,
            pipelines_dir=Path(os.environ.get("TIDEFLOW_PIPELINES_DIR", "pipelines")).resolve(),
            cluster_file=Path(cluster).resolve() if cluster else None,
            artifact_root=os.environ.get(
                "TIDEFLOW_ARTIFACT_ROOT", (home / "artifacts").as_uri()
            ).rstrip("/"),
            mlflow_tracking_uri=os.environ.get("MLFLOW_TRACKING_URI"),
            backend=_backend(),
            checkpoint_roots=os.environ.get("TIDEFLOW_CHECKPOINT_ROOTS", ""),
        )

    def checkpoint_roots_for(self, team: str) -> tuple[str, ...]:
        """The store roots ``team``'s gangs may keep checkpoints under."""
        from tideflow.storage.roots import team_roots

        return team_roots(self.artifact_root, self.checkpoint_roots, team)

    # State shared by every Airflow process (and the broker) on one installation.
    @property
    def ledger_path(self) -> Path:
        return self.home / "leases.db"

    @property
    def broker_journal_path(self) -> Path:
        return self.home / "broker.db"

    @property
    def gangs_dir(self) -> Path:
        return self.home / "gangs"

    @property
    def cluster(self) -> str | None:
        """The cluster inventory file as a string (for triggers' JSON kwargs), or None."""
        return str(self.cluster_file) if self.cluster_file else None
