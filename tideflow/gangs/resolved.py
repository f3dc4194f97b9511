"""A gang training step of one run, resolved once.

Every place that runs a gang (the operator on the local backend or a cluster,
the Argo gang driver) turns the rendered step's plan (``GangStepPlan``) and the
cluster file's priority classes into a ``ResolvedGang`` here, and takes what it
needs from it: the ledger's request, the local job, the cluster
job (from which the Volcano Job or JobSet is built). So the gang's id, its
checkpoint store, its workers' environment, command line, image and resources
follow one rule everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tideflow.backends.protocol import GangJob, WorkerSlot
from tideflow.compile.gang_plan import CheckpointPlan, GangStepPlan, JsonObject
from tideflow.config import HANG_TIMEOUT_ENV
from tideflow.inventory import Inventory
from tideflow.scheduling import GangRequest
from tideflow.scheduling.model import DeviceClass
from tideflow.scheduling.quota import Teams
from tideflow.steps.code import with_code_path
from tideflow.steps.commands import args_argv
from tideflow.steps.context import GANG_ID_ENV, StepContext, StepRun
from tideflow.storage.roots import check_root, gang_store


def gang_id_for(pipeline: str, run_id: str, step: str) -> str:
    """The step run's gang id (``StepRun.gang_id``): the same across retries."""
    return StepRun(pipeline, run_id, step).gang_id


def run_prefix(pipeline: str, run_id: str, step: str) -> str:
    """The step run's key prefix ``PIPELINE/RUN/STEP`` (``StepRun.key_prefix``)."""
    return StepRun(pipeline, run_id, step).key_prefix


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
    args: JsonObject = field(default_factory=dict)
    checkpoint_optional: bool = False  # committing no checkpoint warns instead of failing
    image: str | None = None  # the workers' image on a cluster; None: the platform's
    cpu: str | None = None  # per worker, besides its devices (None: not asked for)
    memory: str | None = None
    code_path: str | None = None  # the pipeline's modules on this machine (PYTHONPATH)
    image_code_path: str | None = None  # the same directory inside the image

    @property
    def run(self) -> StepRun:
        """The step run this gang is (its id is ``run.gang_id``)."""
        return StepRun(self.pipeline, self.run_id, self.step)

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
            labels=self.run.labels(),
            image=self.image,
            cpu=self.cpu,
            memory=self.memory,
            step_files=files,
        )


def _checkpoint_store(
    checkpoint: CheckpointPlan,
    team: str,
    allowed_roots: Sequence[str],
    artifact_root: str,
    prefix: str,
) -> str:
    """The gang's checkpoint store: under the step's root (one the team may write to,
    else ``StoreRootError``) or the artifact root, at the step's ``prefix``."""
    root = checkpoint.store
    if root:
        check_root(root, team, allowed_roots)
    return gang_store(root, artifact_root, prefix)


def _workers_env(plan: GangStepPlan, store: str, gang_id: str) -> dict[str, str]:
    """The workers' environment: the step's (sorted), the checkpoint policy's, the gang's id,
    and the hang timeout unless the step turned it off."""
    env = {
        **{str(k): str(v) for k, v in sorted(plan.env.items())},
        **plan.checkpoint.env(store),
        GANG_ID_ENV: gang_id,
    }
    if plan.hang_timeout is not None:
        env[HANG_TIMEOUT_ENV] = str(int(plan.hang_timeout))
    return env


def _elastic_minimum(minimum: int | str | None, workers: int) -> int | None:
    """The gang's minimum size; elastic only when the minimum is below the size (equal
    means rigid, and so does no minimum)."""
    return int(minimum) if minimum not in (None, "") and int(minimum) < workers else None


class PriorityClassError(ValueError):
    """The run names a priority class its team may not use, or one the cluster file
    does not declare."""


def _priority(
    team: str, named: str | None, own: int, classes: Inventory | None
) -> tuple[int, str | None]:
    """The gang's priority and class: the cluster file's class the run names, else its
    team's default; without either (or without ``classes``) the step's own priority."""
    if classes is None:
        return own, named
    teams = Teams.of(classes)
    if teams is None:
        if named:
            raise PriorityClassError(
                f"priority class '{named}' is named, but the cluster file "
                f"'{classes.name}' declares no priority classes"
            )
        return own, named
    try:
        value, name = teams.priority(team, named)
    except ValueError as exc:
        raise PriorityClassError(str(exc)) from None
    return (own, named) if name is None else (value, name)


def resolve_gang(
    plan: GangStepPlan,
    *,
    pipeline: str,
    team: str,
    run_id: str,
    step: str,
    artifact_root: str,
    allowed_roots: Sequence[str],
    code_path: str | None = None,
    classes: Inventory | None = None,
) -> ResolvedGang:
    """The gang of a rendered ``gang_training`` step ``plan`` in one run.

    ``code_path`` is the pipeline's code directory on this machine. With ``classes``
    (the cluster file), the gang's priority is the class the run names
    (``plan.priority_class``), else its team's default; without either, or without
    ``classes``, the step's own ``priority``.

    Raises ``StoreRootError`` when the step's checkpoint root is not one the
    team may write to (checked at validation too, unless it was a template), and
    ``PriorityClassError`` when the run's class is not one the team may use.
    """
    run = StepRun(pipeline, run_id, step)
    store = _checkpoint_store(plan.checkpoint, team, allowed_roots, artifact_root, run.key_prefix)
    gang_id = run.gang_id
    workers = int(plan.workers)
    priority, priority_class = _priority(team, plan.priority_class or None, plan.priority, classes)
    return ResolvedGang(
        gang_id=gang_id,
        pipeline=pipeline,
        team=team,
        run_id=run_id,
        step=step,
        entrypoint=plan.entrypoint,
        store=store,
        env=_workers_env(plan, store, gang_id),
        workers=workers,
        devices_per_worker=int(plan.devices_per_worker),
        device_class=plan.device_class,
        model=plan.device_model,
        max_restarts=int(plan.max_restarts),
        priority=priority,
        priority_class=priority_class,
        preemptible=plan.preemptible,
        min_workers=_elastic_minimum(plan.min_workers, workers),
        args=dict(plan.args),
        checkpoint_optional=plan.checkpoint.optional,
        image=plan.image,
        cpu=plan.cpu,
        memory=plan.memory,
        code_path=code_path or None,
        image_code_path=plan.code_image_path,
    )
