"""The tideflow page: what it shows (model), where the numbers come from, and its HTML.

Nothing here imports Airflow: the plugin gathers Airflow's part (DAGs and runs
the user may read, and what Airflow's auth manager allows it) and hands it
over as plain data; ``tideflow.ui.access`` says who sees what.
"""

from tideflow.ui.access import BROKER_VIEW, Viewer
from tideflow.ui.model import (
    ChampionRow,
    DagRunRow,
    JournalRow,
    LeaseRow,
    Overview,
    PipelineRow,
    QueueRow,
    TeamRow,
    UsageRow,
)
from tideflow.ui.page import render_page
from tideflow.ui.sources import (
    broker_timeline,
    champions,
    current_leases,
    device_usage,
    gang_queue,
    pipeline_mlflow_runs,
    preemption_journal,
    team_quotas,
)
from tideflow.ui.timeline import BrokerPoint, render_timeline

__all__ = [
    "BROKER_VIEW",
    "BrokerPoint",
    "ChampionRow",
    "DagRunRow",
    "JournalRow",
    "LeaseRow",
    "Overview",
    "PipelineRow",
    "QueueRow",
    "TeamRow",
    "UsageRow",
    "Viewer",
    "broker_timeline",
    "champions",
    "current_leases",
    "device_usage",
    "gang_queue",
    "pipeline_mlflow_runs",
    "preemption_journal",
    "render_page",
    "render_timeline",
    "team_quotas",
]
