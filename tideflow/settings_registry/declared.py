"""Every declared setting, by name."""

from __future__ import annotations

from tideflow.settings_registry.declared_broker import BROKER_SETTINGS
from tideflow.settings_registry.declared_kubernetes import KUBERNETES
from tideflow.settings_registry.declared_platform import PLATFORM
from tideflow.settings_registry.declared_worker import WORKER
from tideflow.settings_registry.model import Setting

SETTINGS: tuple[Setting, ...] = (*PLATFORM, *KUBERNETES, *BROKER_SETTINGS, *WORKER)
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
if len(BY_NAME) != len(SETTINGS):  # pragma: no cover - a declaration made twice
    raise RuntimeError("a TIDEFLOW_* setting is declared twice")
