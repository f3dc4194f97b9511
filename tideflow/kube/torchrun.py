"""The environment torchrun gives each worker, for the pods of a gang object.

An unmodified torchrun script (``dist.init_process_group()`` with ``env://``,
``int(os.environ["LOCAL_RANK"])``) reads what torchrun's agent sets for each
worker it starts (torch ``distributed/elastic/agent/server/local_elastic_agent.py``
``_start_workers``): ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``GROUP_WORLD_SIZE``, ``ROLE_RANK``,
``ROLE_NAME``, ``ROLE_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` and the
``TORCHELASTIC_*`` variables. A gang pod runs one worker, so its local rank is
0 of 1, its group is its pod (group rank = rank) and its role is torchrun's
default. ``TORCHELASTIC_USE_AGENT_STORE`` is left unset: there is no agent
store, rank 0 hosts the rendezvous store itself.

The rank and the restart count differ per pod of one template, so they come
from the pod's own metadata through the downward API, from what each engine's
controller writes on the pods it makes:

* Volcano: the annotations ``volcano.sh/task-index`` and
  ``volcano.sh/job-retry-count`` (volcano
  ``pkg/controllers/job/job_controller_util.go`` createJobPod);
* an Indexed Job under JobSet: the annotation
  ``batch.kubernetes.io/job-completion-index`` (Kubernetes' Job controller,
  as ``JOB_COMPLETION_INDEX``), and the JobSet's label
  ``jobset.sigs.k8s.io/restart-attempt`` on every pod of a restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ROLE_NAME = "default"  # torchrun's --role default


@dataclass(frozen=True)
class WorkerIndex:
    """Where a gang object's controller writes a pod's worker index and restart count."""

    rank_field: str  # a downward-API fieldPath
    restarts_field: str


VOLCANO = WorkerIndex(
    rank_field="metadata.annotations['volcano.sh/task-index']",
    restarts_field="metadata.annotations['volcano.sh/job-retry-count']",
)
JOBSET = WorkerIndex(
    rank_field="metadata.annotations['batch.kubernetes.io/job-completion-index']",
    restarts_field="metadata.labels['jobset.sigs.k8s.io/restart-attempt']",
)


def _field(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def torchrun_env(
    *,
    index: WorkerIndex,
    workers: int,
    master_addr: str,
    master_port: int,
    max_restarts: int,
    run_id: str,
) -> list[dict[str, Any]]:
    """The torchrun variables for every pod of a gang of ``workers`` one-process pods."""
    return [
        _field("RANK", index.rank_field),
        _field("GROUP_RANK", index.rank_field),
        _field("ROLE_RANK", index.rank_field),
        {"name": "LOCAL_RANK", "value": "0"},
        {"name": "WORLD_SIZE", "value": str(workers)},
        {"name": "GROUP_WORLD_SIZE", "value": str(workers)},
        {"name": "ROLE_WORLD_SIZE", "value": str(workers)},
        {"name": "ROLE_NAME", "value": ROLE_NAME},
        {"name": "LOCAL_WORLD_SIZE", "value": "1"},
        {"name": "MASTER_ADDR", "value": master_addr},
        {"name": "MASTER_PORT", "value": str(master_port)},
        _field("TORCHELASTIC_RESTART_COUNT", index.restarts_field),
        {"name": "TORCHELASTIC_MAX_RESTARTS", "value": str(max_restarts)},
        {"name": "TORCHELASTIC_RUN_ID", "value": run_id},
    ]
