"""Platform settings read from the environment (12-factor: nothing in the YAML).

The same pipeline runs on a laptop and on a cluster; what differs (where
artifacts go, which MLflow server, which cluster inventory) is configuration.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tideflow import settings_registry as registry
from tideflow.settings_registry import BACKENDS, ConfigError, bad_setting, env_number

__all__ = [
    "BACKENDS",
    "EXIT_HUNG",
    "HANG_TIMEOUT_ENV",
    "PROGRESS_FILE_ENV",
    "ConfigError",
    "Settings",
    "bad_setting",
    "env_number",
]


def _home() -> Path:
    text = registry.raw("TIDEFLOW_HOME")
    if text is not None:
        registry.declared("TIDEFLOW_HOME").check(text)
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


# Where a gang worker's runtime records its training progress (the step it last
# reached): the supervisor reads it to tell a deterministic failure from a flaky one.
PROGRESS_FILE_ENV = registry.declared("TIDEFLOW_PROGRESS_FILE").name
# Seconds without progress after which a worker's runtime calls itself hung (exit 77).
HANG_TIMEOUT_ENV = registry.declared("TIDEFLOW_HANG_TIMEOUT_S").name
EXIT_HUNG = 77


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
        cluster = registry.optional_path("TIDEFLOW_CLUSTER_FILE")
        artifact_root = registry.optional_text("TIDEFLOW_ARTIFACT_ROOT")
        return cls(
            home=home,
            pipelines_dir=Path(registry.text("TIDEFLOW_PIPELINES_DIR")).resolve(),
            cluster_file=cluster.resolve() if cluster else None,
            artifact_root=(artifact_root or (home / "artifacts").as_uri()).rstrip("/"),
            mlflow_tracking_uri=os.environ.get("MLFLOW_TRACKING_URI"),
            backend=registry.text("TIDEFLOW_BACKEND"),
            checkpoint_roots=registry.text("TIDEFLOW_CHECKPOINT_ROOTS"),
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
