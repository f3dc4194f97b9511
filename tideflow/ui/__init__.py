"""The tideflow page: what it shows (model), where the numbers come from, and its HTML.

Nothing here imports Airflow: the plugin gathers Airflow's part (DAGs and runs
the user may read) and hands it over as plain data.
"""

from tideflow.ui.model import ChampionRow, DagRunRow, Overview, PipelineRow, UsageRow
from tideflow.ui.page import render_page
from tideflow.ui.sources import champions, device_usage, pipeline_mlflow_runs

__all__ = [
    "ChampionRow",
    "DagRunRow",
    "Overview",
    "PipelineRow",
    "UsageRow",
    "champions",
    "device_usage",
    "pipeline_mlflow_runs",
    "render_page",
]
