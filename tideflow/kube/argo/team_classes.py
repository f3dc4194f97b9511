"""The cluster file's priority classes as an Argo gang step's driver gets them.

On Airflow the gang operator reads the cluster file (``TIDEFLOW_CLUSTER_FILE``)
when it submits a gang, and gives the gang the run's class, else its team's
default (``tideflow.gangs.resolve_gang``). The driver's pod on Argo has
no cluster file: the compiler, which read it (``tideflow compile --target argo
--cluster FILE``, else ``TIDEFLOW_CLUSTER_FILE``), passes the part that rule
reads (the declared classes and the pipeline's team) as a cluster document of
its own, and the driver reads it back into an ``Inventory`` and applies the same
function. So a changed cluster file reaches Argo's gangs when the workflow is
compiled again, as the Kubernetes settings do.
"""

from __future__ import annotations

import json

from tideflow.inventory import ClusterSpec, Inventory


def team_classes_json(inventory: Inventory | None, team: str) -> str | None:
    """The classes and ``team``'s entry of the cluster file, as JSON; None without a
    cluster file or with one that declares neither teams nor classes."""
    spec = None if inventory is None else inventory.teams
    if spec is None:
        return None
    excerpt = spec.model_copy(
        update={"teams": tuple(t for t in spec.teams if t.name == team), "borrowing": ()}
    )
    document = excerpt.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def team_classes_inventory(text: str) -> Inventory:
    """What ``team_classes_json`` wrote, as an inventory. ``ValueError`` (pydantic's
    ``ValidationError`` is one) when it is not a cluster document."""
    return Inventory.from_spec(ClusterSpec.model_validate(json.loads(text)))
