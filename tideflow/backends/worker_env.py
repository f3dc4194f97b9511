"""A gang worker's environment on this machine: torchrun's variables, and tideflow's."""

from __future__ import annotations

import os
import socket

from tideflow.backends.protocol import GangJob, WorkerSlot
from tideflow.steps.context import GANG_ID_ENV, OUTPUTS_ENV

_VISIBLE_DEVICES = {"gpu": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worker_env(job: GangJob, slot: WorkerSlot, port: int, restarts: int) -> dict[str, str]:
    """torchrun's environment for one worker (as its agent sets it: torch
    distributed/elastic/agent/server/local_elastic_agent.py), and tideflow's.

    A node is torchrun's group: its workers share LOCAL_WORLD_SIZE, GROUP_RANK
    is the node's place among the gang's nodes, in slot order; workers sharing a node
    get one OpenMP thread each, as torchrun gives them. The step's outputs
    file (``$TIDEFLOW_STEP_OUTPUTS``) is each rank's own: ``{rank}`` in it is the rank.
    """
    local_ranks = [s.rank for s in job.slots if s.node == slot.node]
    nodes = list(dict.fromkeys(s.node for s in job.slots))
    env = {
        **os.environ,
        **job.env,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(slot.rank),
        "WORLD_SIZE": str(job.workers),
        "LOCAL_RANK": str(local_ranks.index(slot.rank)),
        "LOCAL_WORLD_SIZE": str(len(local_ranks)),
        "GROUP_RANK": str(nodes.index(slot.node)),
        "GROUP_WORLD_SIZE": str(len(nodes)),
        "ROLE_RANK": str(slot.rank),
        "ROLE_NAME": "default",
        "ROLE_WORLD_SIZE": str(job.workers),
        "TORCHELASTIC_RESTART_COUNT": str(restarts),
        "TORCHELASTIC_MAX_RESTARTS": str(job.max_restarts),
        "TORCHELASTIC_RUN_ID": job.gang_id,
        GANG_ID_ENV: job.gang_id,
        "TIDEFLOW_DEVICE_CLASS": job.device_class,
        "TIDEFLOW_RESTART_COUNT": str(restarts),
        "TIDEFLOW_EMULATED": "1" if job.emulated else "0",
        "PYTHONUNBUFFERED": "1",
    }
    if len(local_ranks) > 1 and "OMP_NUM_THREADS" not in env:
        # torchrun's default for several workers on one node (torch/distributed/run.py):
        # each worker's thread pool would otherwise take every core, and the workers
        # would fight over them. A number the user or the step set is kept.
        env["OMP_NUM_THREADS"] = "1"
    if OUTPUTS_ENV in job.env:  # the step's outputs file: one per rank
        env[OUTPUTS_ENV] = job.env[OUTPUTS_ENV].replace("{rank}", str(slot.rank))
    variable = _VISIBLE_DEVICES.get(job.device_class)
    if variable:
        # Emulated accelerators must not touch a real device that happens to exist.
        env[variable] = "" if job.emulated else ",".join(str(d) for d in slot.devices)
    return env
