"""Pick a device for a single-worker step from a preference list (evaluation).

Preferences, in the order the step lists them:
  npu        an NPU, if the inventory has any and one is free
  gpu-spare  an idle GPU through a low-priority, preemptible "spare" lease: it
             never goes ahead of a training gang that is waiting for GPUs,
             and the broker may take it back
  gpu        a GPU with an ordinary lease
  cpu        the CPU, without a lease
Nothing free and no ``cpu`` in the list: the caller waits and asks again.
"""

from __future__ import annotations

from dataclasses import dataclass

from tideflow.scheduling.ledger import LeaseLedger
from tideflow.scheduling.model import DeviceClass, GangRequest, Lease, Refusal

SPARE_PRIORITY = -100
PREFERENCES = ("npu", "gpu-spare", "gpu", "cpu")


@dataclass(frozen=True)
class DeviceChoice:
    preference: str  # which entry of the list won
    device_class: str  # cpu / gpu / npu
    lease: Lease | None  # None for the CPU


def choose_device(
    ledger: LeaseLedger,
    preferences: tuple[str, ...],
    *,
    gang_id: str,
    team: str,
    holder: str,
    ttl_s: float,
) -> DeviceChoice | Refusal:
    reasons = []
    for preference in preferences:
        if preference == "cpu":
            ledger.forget(gang_id)
            return DeviceChoice("cpu", "cpu", None)
        device_class: DeviceClass = "npu" if preference == "npu" else "gpu"
        if ledger.inventory.total(device_class) == 0:
            reasons.append(f"{preference}: the cluster has no {device_class.upper()}")
            continue
        spare = preference == "gpu-spare"
        request = GangRequest(
            gang_id,
            team,
            device_class,
            None,
            1,
            1,
            priority=SPARE_PRIORITY if spare else 0,
            preemptible=True,
        )
        result = ledger.try_acquire(request, holder, ttl_s)
        if isinstance(result, Lease):
            return DeviceChoice(preference, device_class, result)
        reasons.append(f"{preference}: {result.reason}")
    never = all("the cluster has no" in reason for reason in reasons)
    return Refusal("; ".join(reasons) or "no device preference given", never=never)
