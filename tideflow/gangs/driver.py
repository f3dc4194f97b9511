"""An Argo workflow's gang step: create the gang, follow it to its end, stop it with the step.

    python -m tideflow.gangs.driver gang_training --pipeline P --team T --step S
        --run-id R --config JSON [--set ...] [--param ...] --kube-settings JSON
        [--team-classes JSON] [--owner-name WORKFLOW --owner-uid UID] --outputs DIR

The arguments are the standalone executor's (``tideflow.steps.standalone``): the
rendered step comes as ``--config`` plus one ``--set`` per value the workflow
fills in, so a gang's size may be a workflow parameter: the step's plan as JSON
(``tideflow.compile.gang_plan``). The step is resolved
as the operator resolves it (``tideflow.gangs.resolve_gang``) and submitted
through the same backend (``tideflow.backends.kubernetes``), so on Argo as on
Airflow the gang's object is named from its id and exists at most once, and
carries the same priority class: the run's (``priority_class`` in the step),
else its team's default, from the cluster file the workflow was compiled with
(``--team-classes``; resolved by ``resolve_gang``, as the operator's):

* a retried step (a new driver pod) finds the gang its earlier attempt made and
  follows it if it still runs, or replaces it if it failed;
* a preempted gang is submitted again with the restarts it has left;
* when the step is stopped (its ``activeDeadlineSeconds``, ``argo stop`` or
  ``terminate``: the pod gets SIGTERM) the driver deletes the gang before it
  exits, so a timed-out step leaves no gang running;
* the gang is owned by the workflow, so deleting the workflow deletes it even
  if the driver was killed without its grace.

Outputs (files under DIR, Argo's output parameters): ``checkpoint_store``, and
``checkpoint`` / ``checkpoint_step`` of the newest committed checkpoint. Exit
codes: 0 the gang succeeded, 1 it failed (or committed no checkpoint its step
requires, ``tideflow.gangs.outputs``), 2 bad arguments (a priority class the
team may not use among them), 143 stopped.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tideflow.backends.protocol import GangJob, GangState, GangStatus
from tideflow.compile.gang_plan import JsonObject, gang_plan_from_json
from tideflow.gangs.resolved import ResolvedGang
from tideflow.kube.argo.team_classes import team_classes_inventory
from tideflow.steps.standalone_io import GANG_OUTPUTS

if TYPE_CHECKING:
    from tideflow.kube.settings import KubeSettings

POLL_S = 5.0
EXIT_STOPPED = 143


class StoppedError(Exception):
    """The step was told to stop (SIGTERM); the gang has been deleted."""


class RefusedClassError(Exception):
    """The run names a priority class its team may not use, or one not declared."""


def drive(
    backend: Any,
    job: GangJob,
    *,
    stop: threading.Event,
    say: Callable[[str], None] = print,
    poll_s: float | None = None,
) -> GangStatus:
    """Submit ``job`` and follow it, every ``poll_s`` (default ``POLL_S``), until it ends;
    resubmit it when it is preempted.

    Raises ``StoppedError`` after deleting the gang when ``stop`` is set.
    """
    poll_s = POLL_S if poll_s is None else poll_s  # read when called, not when defined
    status: GangStatus = backend.submit(job)
    say(f"tideflow: gang {job.gang_id} is {status.state} ({job.workers} worker(s))")
    seen = (status.state, status.restarts)
    while True:
        if stop.wait(poll_s):
            backend.cancel(job.gang_id)
            say(f"tideflow: stopped; gang {job.gang_id} deleted")
            raise StoppedError()
        current = backend.status(job.gang_id)
        if current is None:
            raise RuntimeError(f"the gang object of {job.gang_id} was deleted from outside")
        status = current
        if (status.state, status.restarts) != seen:
            seen = (status.state, status.restarts)
            say(f"tideflow: gang {status.state} (restarts: {status.restarts}): {status.message}")
        if status.state is GangState.PREEMPTED:
            status = backend.submit(job)  # resumes from its checkpoint, restarts kept
            continue
        if status.state.finished:
            return status


def _parser() -> argparse.ArgumentParser:
    """The standalone executor's arguments plus the cluster's settings and the gang's owner."""
    from tideflow.steps.standalone_io import build_parser

    parser = build_parser(("gang_training",), "python -m tideflow.gangs.driver")
    parser.add_argument("--kube-settings", required=True, help="KubeSettings as JSON")
    parser.add_argument("--team-classes", help="the cluster file's classes and the team, as JSON")
    parser.add_argument("--owner-name", help="the Workflow that owns the gang")
    parser.add_argument("--owner-uid", help="its uid")
    return parser


def _resolved(args: argparse.Namespace, config: JsonObject, settings: KubeSettings) -> ResolvedGang:
    """The step resolved as the operator resolves it, with the cluster file's class: the
    run's, else its team's default; as planned where the workflow was compiled without
    classes."""
    from tideflow.gangs.resolved import PriorityClassError, resolve_gang
    from tideflow.storage.roots import team_roots

    classes = None if args.team_classes is None else team_classes_inventory(args.team_classes)
    try:
        return resolve_gang(
            gang_plan_from_json(config),
            pipeline=args.pipeline,
            team=args.team,
            run_id=args.run_id,
            step=args.step,
            artifact_root=settings.artifact_root,
            allowed_roots=team_roots(settings.artifact_root, settings.checkpoint_roots, args.team),
            classes=classes,
        )
    except PriorityClassError as exc:
        raise RefusedClassError(str(exc)) from None


def _cluster_job(
    gang: ResolvedGang, args: argparse.Namespace, params: JsonObject, settings: KubeSettings
) -> GangJob:
    """The gang's job: the step's identity in the workers' env, its context files in the pods."""
    from tideflow.steps.context import StepContext

    return gang.cluster_job(
        # No operator makes this step's MLflow run: rank 0 finds or makes it
        # under the workflow's pipeline run (tideflow.runtime.metrics).
        gang.run.env(gang.team),
        # The step's context files in the pods, as a data-prep step gets them.
        context=StepContext(
            pipeline=args.pipeline,
            team=args.team,
            step=args.step,
            dag_id=args.pipeline,
            run_id=args.run_id,
            try_number=args.attempt + 1,
            artifact_root=settings.artifact_root,
            params=params,
        ),
    )


def _owner(args: argparse.Namespace) -> Any:
    """The Workflow that owns the gang (a ``V1OwnerReference``), or None without one."""
    from kubernetes import client

    if not (args.owner_name and args.owner_uid):
        return None
    return client.V1OwnerReference(
        api_version="argoproj.io/v1alpha1",
        kind="Workflow",
        name=args.owner_name,
        uid=args.owner_uid,
        block_owner_deletion=False,
    )


def _follow(backend: Any, job: GangJob) -> GangStatus | None:
    """Drive the gang to its end, stopping it on SIGTERM or SIGINT (then None)."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        return drive(backend, job, stop=stop, say=lambda line: print(line, flush=True))
    except StoppedError:
        return None


def _finish(gang: ResolvedGang, status: GangStatus, outputs_dir: Path) -> int:
    """The exit code of an ended gang; a succeeded one's checkpoint written as outputs."""
    from tideflow.gangs.outputs import NoCheckpointError, gang_outputs
    from tideflow.steps.standalone_io import write_outputs

    if status.state is not GangState.SUCCEEDED:
        print(
            f"tideflow: gang {status.state}: {status.message} (restarts: {status.restarts})",
            file=sys.stderr,
        )
        return 1
    try:
        outputs = gang_outputs(gang, warn=lambda line: print(line, file=sys.stderr, flush=True))
    except NoCheckpointError as exc:
        print(f"tideflow: {exc}", file=sys.stderr)
        return 1
    write_outputs(outputs_dir, outputs, GANG_OUTPUTS)
    return 0


def main(argv: list[str] | None = None, *, api_client: Any = None) -> int:
    from tideflow.backends.kubernetes import KubernetesBackend
    from tideflow.kube.client import connect
    from tideflow.kube.settings import settings_from_json
    from tideflow.steps.standalone_io import BAD_ARGUMENTS, read_step
    from tideflow.storage.roots import StoreRootError

    args = _parser().parse_args(argv)
    try:
        config, params = read_step(args)
        settings = settings_from_json(args.kube_settings)
        gang = _resolved(args, config, settings)
        job = _cluster_job(gang, args, params, settings)
    except RefusedClassError as exc:
        print(f"tideflow: step '{args.step}': {exc}", file=sys.stderr)
        return 2
    except (*BAD_ARGUMENTS, StoreRootError) as exc:
        print(f"tideflow: step '{args.step}': bad arguments: {exc}", file=sys.stderr)
        return 2
    backend = KubernetesBackend(api_client or connect(), settings, owner=_owner(args))
    status = _follow(backend, job)
    if status is None:
        return EXIT_STOPPED
    return _finish(gang, status, Path(args.outputs))


if __name__ == "__main__":
    sys.exit(main())
