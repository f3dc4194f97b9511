"""Browser addresses of MLflow objects, for links from Airflow and the tideflow page.

The tracking URI is what the workers use; people may reach the same server
under another name (an ingress, a port-forward), so ``TIDEFLOW_MLFLOW_UI_URL``
overrides it. A tracking store that is not a server (SQLite, a path) has no
page to link to.
"""

from __future__ import annotations

import os
from urllib.parse import quote

from tideflow import settings_registry as registry

UI_URL_VARIABLE = registry.declared("TIDEFLOW_MLFLOW_UI_URL").name


def mlflow_ui_base() -> str | None:
    base = registry.optional_text(UI_URL_VARIABLE) or os.environ.get("MLFLOW_TRACKING_URI", "")
    if not base.startswith(("http://", "https://")):
        return None
    return base.rstrip("/")


def run_url(experiment_id: str, run_id: str) -> str | None:
    base = mlflow_ui_base()
    if base is None:
        return None
    return f"{base}/#/experiments/{quote(experiment_id)}/runs/{quote(run_id)}"


def model_version_url(model: str, version: str | int) -> str | None:
    base = mlflow_ui_base()
    if base is None:
        return None
    return f"{base}/#/models/{quote(model, safe='')}/versions/{quote(str(version))}"
