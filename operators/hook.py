"""``TideflowHook``: the one place the operators read the platform's settings and open
its state (the lease ledger, the cluster's gang backend).

The settings are read afresh on each call: a deferred task resumes in another
process, and reads what the environment says there. The triggers do not use it:
they run in the triggerer, on the paths serialized with them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

if TYPE_CHECKING:
    from tideflow.config import Settings
    from tideflow.scheduling import LeaseLedger


class TideflowHook(BaseHook):
    """The platform as an operator reaches it: ``TIDEFLOW_*`` settings, the lease ledger
    they name, and the Kubernetes gang backend when ``TIDEFLOW_BACKEND=kubernetes``."""

    def settings(self) -> Settings:
        from tideflow.config import Settings

        return Settings.from_env()

    def on_cluster(self) -> bool:
        """Whether gang steps run on Kubernetes (the cluster's scheduler admits them)."""
        return self.settings().backend == "kubernetes"

    def ledger(self) -> LeaseLedger:
        """The lease ledger of ``TIDEFLOW_HOME``, on the cluster file's inventory."""
        from tideflow.gangs import open_ledger

        settings = self.settings()
        return open_ledger(settings.ledger_path, settings.cluster)

    def cluster_backend(self) -> Any:
        """The Kubernetes gang backend, with the credentials ``tideflow.operators.cluster``
        finds."""
        from tideflow.operators.cluster import cluster_backend

        return cluster_backend()
