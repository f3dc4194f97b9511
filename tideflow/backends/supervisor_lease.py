"""The lease a gang's supervisor holds for it, from its start until none of its
processes runs.

The lease must outlive every worker: renewed while the gang trains and while it
stops (a checkpoint on notice can take longer than the lease's time to live), and
given back only once the supervisor has seen every worker's process group dead.
A gang stopped without the grace to checkpoint (forced) loses the work since its
newest checkpoint, which the release accounts.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from tideflow import settings_registry as registry
from tideflow.backends.protocol import GangJob

if TYPE_CHECKING:
    from tideflow.scheduling import LeaseLedger


class LeaseRenewal:
    """A supervisor's renewing of its gang's lease in the ledger (nothing to renew when
    the gang holds none)."""

    def __init__(self, job: GangJob) -> None:
        self.job = job
        self.next_renewal = 0.0

    def _ledger(self) -> LeaseLedger | None:
        if not (self.job.lease_id and self.job.lease_db):
            return None
        from tideflow.inventory import inventory_for
        from tideflow.scheduling import LeaseLedger

        return LeaseLedger(
            Path(self.job.lease_db), inventory_for(registry.optional_text("TIDEFLOW_CLUSTER_FILE"))
        )

    def renew(self) -> bool:
        """Renew it when it is due; False when it is gone (expired or taken back)."""
        if time.monotonic() < self.next_renewal:
            return True
        self.next_renewal = time.monotonic() + self.job.lease_ttl_s / 3
        ledger = self._ledger()
        if ledger is None or not self.job.lease_id:
            return True
        from tideflow.scheduling import LeaseLostError

        try:
            ledger.renew(self.job.lease_id, self.job.lease_ttl_s)
        except LeaseLostError:
            return False
        return True

    def release(self, *, forced_at: float | None = None) -> None:
        """Give the devices back; a stop forced at ``forced_at`` is accounted with the
        work since the gang's newest checkpoint as lost."""
        ledger = self._ledger()
        if ledger is None or not self.job.lease_id:
            return
        lost = 0.0
        lease = ledger.lease_for(self.job.gang_id)
        if forced_at is not None and lease is not None and lease.lease_id == self.job.lease_id:
            from tideflow.checkpoint import CHECKPOINT_URI_ENV
            from tideflow.checkpoint.recency import work_lost_at

            store = self.job.env.get(CHECKPOINT_URI_ENV)
            # never 0: a forced stop is told from a checkpointed one by its loss
            lost = max(work_lost_at(forced_at, lease.acquired_at, store), 1e-9)
        ledger.release(self.job.lease_id, lost_s=lost)
