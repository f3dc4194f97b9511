"""The tideflow Airflow plugin, registered through the ``airflow.plugins`` entry point.

It makes the installation visible to Airflow (``airflow plugins`` lists it);
the UI page and operator extra links are added here as they land.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin


class TideflowPlugin(AirflowPlugin):
    name = "tideflow"
