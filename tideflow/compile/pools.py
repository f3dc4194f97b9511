"""Airflow pool sizes derived from a cluster inventory."""

from __future__ import annotations

from tideflow.compile.dag_plan import POOL_FOR_CLASS
from tideflow.inventory import Inventory


def pool_sizes(inventory: Inventory) -> dict[str, int]:
    """One slot per device of each class.

    A class the inventory lacks still gets one slot: its steps then run
    emulated on the CPU instead of queueing forever in an empty pool.
    """
    return {
        pool: max(1, inventory.total(device_class))  # type: ignore[arg-type]
        for device_class, pool in POOL_FOR_CLASS.items()
    }
