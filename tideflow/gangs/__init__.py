"""A gang training step resolved once (``resolved``) and run: locally under a lease
(``local``) or on a cluster's gang scheduler, where an Argo workflow's step drives it
(``driver``)."""

from tideflow.gangs.evictions import EvictionStep, enforce_evictions
from tideflow.gangs.local import (
    LEASE_TTL_S,
    GangRequestJson,
    build_job,
    holder_name,
    local_command,
    machine_has,
    open_ledger,
    request_from_dict,
    request_to_dict,
)
from tideflow.gangs.resolved import (
    PriorityClassError,
    ResolvedGang,
    gang_id_for,
    resolve_gang,
    run_prefix,
)

__all__ = [
    "LEASE_TTL_S",
    "EvictionStep",
    "GangRequestJson",
    "PriorityClassError",
    "ResolvedGang",
    "build_job",
    "enforce_evictions",
    "gang_id_for",
    "holder_name",
    "local_command",
    "machine_has",
    "open_ledger",
    "request_from_dict",
    "request_to_dict",
    "resolve_gang",
    "run_prefix",
]
