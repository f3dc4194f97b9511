"""A gang training step of one run, resolved once.

Every place that runs a gang (the operator on the local backend or a cluster,
the Argo gang driver) turns the rendered step into a ``ResolvedGang`` here, and
takes what it needs from it: the ledger's request, the local job, the cluster
job (from which the Volcano Job or JobSet is built). So the gang's id, its
checkpoint store, its workers' environment, command line, image and resources
follow one rule everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tideflow.backends.protocol import GangJob, WorkerSlot
from tideflow.checkpoint.policy import checkpoint_env
from tideflow.config import HANG_TIMEOUT_ENV
from tideflow.kube.names import dns_label
from tideflow.scheduling import GangRequest
from tideflow.scheduling.model import DeviceClass
from tideflow.steps.code import with_code_path
from tideflow.steps.commands import args_argv
from tideflow.steps.context import StepContext
from tideflow.storage import safe_segment
from tideflow.storage.roots import check_root, gang_store

DEFAULT_HANG_TIMEOUT_S = 1800  # the spec's default, for configs written without the field


def gang_id_for(pipeline: str, run_id: str, step: str) -> str:
    """Stable across retries of the same step in the same run (Airflow's or Argo's)."""
    return f"{pipeline}/{run_id}/{step}"


def run_prefix(pipeline: str, run_id: str, step: str) -> str:
    """The step's key prefix ``PIPELINE/RUN/STEP`` (as ``StepContext.run_prefix``)."""
    return "/".join(safe_segment(part) for part in (pipeline, run_id, step))


@dataclass(frozen=True)
class ResolvedGang:
    gang_id: str
    pipeline: str
    team: str
    run_id: str
    step: str
    entrypoint: str | tuple[str, ...]  # module:function, or a command
    store: str  # the checkpoint store this gang writes and resumes from
    env: dict[str, str]  # the workers' environment: the step's, then tideflow's
    workers: int
    devices_per_worker: int
    device_class: DeviceClass
    model: str | None
    max_restarts: int
    priority: int = 0
    priority_class: str | None = None  # the cluster file's class (its value is ``priority``)
    preemptible: bool = True
    min_workers: int | None = None  # elastic when below ``workers``
    # A module:function entry point's keyword arguments; a command's options (``command``).
    args: dict[str, Any] = field(default_factory=dict)
    checkpoint_optional: bool = False  # committing no checkpoint warns instead of failing
    image: str | None = None  # the workers' image on a cluster; None: the platform's
    cpu: str | None = None  # per worker, besides its devices (None: not asked for)
    memory: str | None = None
    code_path: str | None = None  # the pipeline's modules on this machine (PYTHONPATH)
    image_code_path: str | None = None  # the same directory inside the image

    @property
    def command(self) -> tuple[str, ...] | None:
        """A command entry point with its ``args`` appended as options (``args_argv``)."""
        if isinstance(self.entrypoint, str):
            return None
        return (*self.entrypoint, *args_argv(self.args))

    def local_env(self, extra_env: Mapping[str, str] | None = None) -> dict[str, str]:
        """The workers' environment on this machine: the pipeline's code dir on PYTHONPATH."""
        return with_code_path({**self.env, **(extra_env or {})}, self.code_path)

    def request(self) -> GangRequest:
        """What the lease ledger needs to place the gang."""
        return GangRequest(
            gang_id=self.gang_id,
            team=self.team,
            device_class=self.device_class,
            model=self.model,
            workers=self.workers,
            devices_per_worker=self.devices_per_worker,
            priority=self.priority,
            preemptible=self.preemptible,
            min_workers=self.min_workers,
            priority_class=self.priority_class,
        )

    def cluster_job(
        self, extra_env: Mapping[str, str] | None = None, *, context: StepContext | None = None
    ) -> GangJob:
        """The gang for a cluster's gang scheduler: it places the workers, so no lease.

        The command is kept as written (``python`` is the image's interpreter), its
        args appended as options. With ``context``, the pods get the step's context
        and args as files, as the local workers and a data-prep step do.
        """
        files = {}
        if context is not None:
            files = {
                "context.json": context.to_json(),
                "args.json": json.dumps(self.args, default=str, sort_keys=True),
            }
        if self.command is None:
            raise ValueError(
                f"step '{self.step}': entry point {self.entrypoint!r} is module:function; on "
                "Kubernetes a gang step needs a command entry point (a list such as "
                "[python, -m, my.module])"
            )
        return GangJob(
            gang_id=self.gang_id,
            command=self.command,
            # In the pods, the image's copy of the pipeline's code goes first on PYTHONPATH.
            env=with_code_path({**self.env, **(extra_env or {})}, self.image_code_path, {}),
            slots=tuple(
                WorkerSlot(rank, "", tuple(range(self.devices_per_worker)))
                for rank in range(self.workers)
            ),
            device_class=self.device_class,
            emulated=False,
            max_restarts=self.max_restarts,
            team=self.team,
            model=self.model,
            priority=self.priority,
            priority_class=self.priority_class,
            labels={
                "tideflow.io/pipeline": dns_label(self.pipeline),
                "tideflow.io/step": dns_label(self.step),
                "tideflow.io/run": dns_label(self.run_id),
            },
            image=self.image,
            cpu=self.cpu,
            memory=self.memory,
            step_files=files,
        )


def _checkpoint_store(
    checkpoint: Mapping[str, Any],
    team: str,
    allowed_roots: Sequence[str],
    artifact_root: str,
    prefix: str,
) -> str:
    """The gang's checkpoint store: under the step's root (one the team may write to,
    else ``StoreRootError``) or the artifact root, at the step's ``prefix``."""
    root = checkpoint.get("store") or None
    if root:
        check_root(root, team, allowed_roots)
    return gang_store(root, artifact_root, prefix)


def _workers_env(
    config: Mapping[str, Any], checkpoint: Mapping[str, Any], store: str, gang_id: str
) -> dict[str, str]:
    """The workers' environment: the step's (sorted), the checkpoint policy's, the gang's id,
    and the hang timeout unless the step turned it off."""
    env = {
        **{str(k): str(v) for k, v in sorted((config.get("env") or {}).items())},
        **checkpoint_env(checkpoint, store),
        "TIDEFLOW_GANG_ID": gang_id,
    }
    hang = config.get("hang_timeout", DEFAULT_HANG_TIMEOUT_S)
    if hang not in (None, ""):
        env[HANG_TIMEOUT_ENV] = str(int(hang))
    return env


def _elastic_minimum(minimum: Any, workers: int) -> int | None:
    """The gang's minimum size; elastic only when the minimum is below the size (equal
    means rigid, and so does no minimum)."""
    return int(minimum) if minimum not in (None, "") and int(minimum) < workers else None


def resolve_gang(
    *,
    pipeline: str,
    team: str,
    run_id: str,
    step: str,
    config: Mapping[str, Any],
    artifact_root: str,
    allowed_roots: Sequence[str],
) -> ResolvedGang:
    """The gang of a rendered ``gang_training`` step (its spec fields) in one run.

    Besides the spec's fields, ``config`` may carry the step's ``image`` (its own or
    the pipeline's) and the pipeline's ``code``: ``path`` (resolved on this machine)
    and ``image_path`` (inside the image).

    Raises ``StoreRootError`` when the step's checkpoint root is not one the
    team may write to (checked at validation too, unless it was a template).
    """
    checkpoint = config.get("checkpoint") or {"keep_last": 3}
    store = _checkpoint_store(
        checkpoint, team, allowed_roots, artifact_root, run_prefix(pipeline, run_id, step)
    )
    gang_id = gang_id_for(pipeline, run_id, step)
    env = _workers_env(config, checkpoint, store, gang_id)
    workers = int(config["workers"])
    entrypoint = config["entrypoint"]
    device = config.get("device") or {"class": "cpu", "model": None}
    resources = config.get("resources") or {}
    code = config.get("code") or {}
    return ResolvedGang(
        gang_id=gang_id,
        pipeline=pipeline,
        team=team,
        run_id=run_id,
        step=step,
        entrypoint=entrypoint if isinstance(entrypoint, str) else tuple(map(str, entrypoint)),
        store=store,
        env=env,
        workers=workers,
        devices_per_worker=int(config.get("devices_per_worker", 1)),
        device_class=device["class"],
        model=device.get("model"),
        max_restarts=int(config.get("max_restarts", 0)),
        priority=int(config.get("priority", 0)),
        priority_class=config.get("priority_class") or None,
        preemptible=bool(config.get("preemptible", True)),
        min_workers=_elastic_minimum(config.get("min_workers"), workers),
        args=dict(config.get("args") or {}),
        checkpoint_optional=bool(checkpoint.get("optional", False)),
        image=config.get("image") or None,
        cpu=_quantity(resources.get("cpu")),
        memory=_quantity(resources.get("memory")),
        code_path=code.get("path") or None,
        image_code_path=code.get("image_path") or None,
    )


def _quantity(value: Any) -> str | None:
    return None if value in (None, "") else str(value)
