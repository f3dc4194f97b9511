"""Gang scheduling on one inventory: placement (pure) and the shared lease ledger."""

from tideflow.scheduling.ledger import LeaseLedger, LeaseLostError
from tideflow.scheduling.model import GangRequest, Lease, Refusal, WorkerPlacement
from tideflow.scheduling.placement import place

__all__ = [
    "GangRequest",
    "Lease",
    "LeaseLedger",
    "LeaseLostError",
    "Refusal",
    "WorkerPlacement",
    "place",
]
