"""Gang scheduling on one inventory: placement (pure) and the shared lease ledger."""

from tideflow.scheduling.ledger import InventoryChangedError, LeaseLedger, LeaseLostError
from tideflow.scheduling.model import DeviceUsage, GangRequest, Lease, Refusal, WorkerPlacement
from tideflow.scheduling.placement import place
from tideflow.scheduling.preference import DeviceChoice, choose_device

__all__ = [
    "DeviceChoice",
    "DeviceUsage",
    "GangRequest",
    "InventoryChangedError",
    "Lease",
    "LeaseLedger",
    "LeaseLostError",
    "Refusal",
    "WorkerPlacement",
    "choose_device",
    "place",
]
