"""The tideflow Airflow plugin, registered through the ``airflow.plugins`` entry point.

It mounts the tideflow page (a FastAPI app, ``plugins/app.py``) under
``/tideflow`` and adds it to the Airflow UI's navigation. The operators' extra
links need no registration: Airflow stores them as XComs when a task ends.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin


def _fastapi_apps() -> list[dict[str, object]]:
    from tideflow.plugins.app import URL_PREFIX, app

    return [{"app": app, "url_prefix": URL_PREFIX, "name": "tideflow"}]


class TideflowPlugin(AirflowPlugin):
    name = "tideflow"
    fastapi_apps = _fastapi_apps()
    external_views = [
        {
            "name": "tideflow",
            "href": "tideflow/",
            "destination": "nav",
            "url_route": "tideflow",
        }
    ]
