"""What a running local cluster is made of: its processes and ports, kept in ``home/state.json``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Service:
    pid: int
    port: int
    log: str


@dataclass
class ClusterState:
    home: str
    server: str = ""
    services: dict[str, Service] = field(default_factory=dict)

    @property
    def admin(self) -> Path:
        """The admin kubeconfig (``system:masters``)."""
        return Path(self.home) / "kubeconfig"

    @property
    def path(self) -> Path:
        return Path(self.home) / "state.json"

    def save(self) -> None:
        self.path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, home: Path) -> ClusterState | None:
        try:
            raw = json.loads((home / "state.json").read_text())
        except (OSError, ValueError):
            return None
        services = {name: Service(**value) for name, value in raw.get("services", {}).items()}
        return cls(home=raw["home"], server=raw.get("server", ""), services=services)
