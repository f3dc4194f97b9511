"""``python -m tideflow.stack up|down|status|demo``: the local stack for a laptop or CI."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from tideflow import settings_registry as registry
from tideflow.stack.airflow_api import AirflowApi, AirflowApiError
from tideflow.stack.processes import StackError, group_alive, stop_group
from tideflow.stack.services import (
    REPO,
    S3_IDENTITIES,
    StackState,
    private_dir,
    start_airflow,
    start_mlflow,
    start_s3,
)

ORDER = ("s3", "mlflow", "airflow")


def default_home() -> Path:
    return Path(registry.optional_path("TIDEFLOW_HOME") or REPO / ".tideflow").resolve()


def default_pools() -> dict[str, int]:
    from tideflow.compile.pools import pool_sizes
    from tideflow.inventory import inventory_for

    return pool_sizes(inventory_for(registry.optional_text("TIDEFLOW_CLUSTER_FILE")))


def up(
    home: Path, *, dags_folder: Path = REPO / "dags", pipelines: Path = REPO / "pipelines"
) -> StackState:
    """Start whatever is not running yet; idempotent."""
    private_dir(home)
    state = StackState.load(home) or StackState(str(home))
    state.services = {k: v for k, v in state.services.items() if group_alive(v.pid)}
    try:
        if "s3" not in state.services:
            state.services["s3"] = start_s3(state)
            state.save()
        if "mlflow" not in state.services:
            state.services["mlflow"] = start_mlflow(state)
            state.save()
        if "airflow" not in state.services:
            state.services["airflow"] = start_airflow(
                state, dags_folder=dags_folder, pipelines=pipelines, pools=default_pools()
            )
            state.save()
    except StackError:
        state.save()
        raise
    return state


def down(home: Path) -> None:
    state = StackState.load(home)
    if state is None:
        return
    for name in reversed(ORDER):
        service = state.services.get(name)
        if service is not None:
            stop_group(service.pid)
    state.services = {}
    state.save()


def describe(state: StackState) -> str:
    lines = []
    for name in ORDER:
        service = state.services.get(name)
        if service is not None:
            alive = "running" if group_alive(service.pid) else "stopped"
            lines.append(f"  {name:8} {service.url:28} {alive} (log: {service.log})")
    if "airflow" in state.services:
        lines.append(f"  Airflow login: {state.airflow_user} / {state.airflow_password}")
    if "s3" in state.services:
        lines.append(f"  S3 credentials: {Path(state.home) / S3_IDENTITIES} (accessKey, secretKey)")
    return "\n".join(lines)


def broker_run_bound_s() -> float:
    """How long a triggered run of the broker DAG may take: its sensor's bound
    (``TIDEFLOW_BROKER_SENSE_S``) and a reclaim's grace (``TIDEFLOW_BROKER_GRACE_S``),
    twice, since a scheduled run may be the DAG's one active run when it is triggered,
    and two minutes for the scheduler to start the tasks."""
    from tideflow.broker.settings import BrokerSettings

    settings = BrokerSettings.from_env()
    grace = settings.grace_s if settings is not None else 0.0
    return 2 * (registry.number("TIDEFLOW_BROKER_SENSE_S") + grace) + 120


def broker_step(api: AirflowApi, timeout_s: float | None = None) -> Callable[[], str]:
    """One broker step through Airflow: a run of the broker DAG, waited for at most
    ``timeout_s`` (by default as long as one may take: ``broker_run_bound_s``)."""
    from tideflow.broker.settings import BROKER_DAG_ID

    bound = broker_run_bound_s() if timeout_s is None else timeout_s

    def step() -> str:
        run_id = api.trigger(BROKER_DAG_ID)
        return api.wait_for_run(BROKER_DAG_ID, run_id, bound)

    return step


def team_demo(state: StackState, api: AirflowApi) -> bool:
    """The multi-team story (``tideflow.stack.team_story``) on the running stack."""
    from tideflow.broker.settings import BROKER_DAG_ID
    from tideflow.stack.team_story import run_team_story

    try:
        api.wait_for_dag(BROKER_DAG_ID, timeout_s=120)
    except AirflowApiError:
        print(
            "The broker DAG is not there: this stack was started without the lab's broker "
            "settings. Restart it (make down && make demo) to see the teams' story."
        )
        return False
    api.unpause(BROKER_DAG_ID)
    print(
        "\nTeams: the broker (team inference, a quota of 4 GPUs) follows a diurnal load "
        "whose day lasts 3 minutes; vision (2 GPUs) may borrow what inference lends.",
        flush=True,
    )
    result = run_team_story(
        Path(state.home), broker_step(api), say=lambda line: print(line, flush=True)
    )
    if not result.told:
        print("The load did not climb back within the demo's time; nothing was reclaimed.")
    return result.told


def demo(home: Path, dag_id: str, timeout_s: float) -> int:
    from tideflow.stack.team_story import BROKER_ENV

    for name, value in BROKER_ENV.items():  # the lab: two teams and the broker
        os.environ.setdefault(name, value)
    state = up(home)
    print("tideflow local stack is up:\n" + describe(state), flush=True)
    api = AirflowApi(state.services["airflow"].url, state.airflow_user, state.airflow_password)
    api.wait_for_dag(dag_id, timeout_s=180)
    api.unpause(dag_id)
    run_id = api.trigger(dag_id)
    print(f"triggered {dag_id} run {run_id}; waiting for it to finish ...", flush=True)
    result = api.wait_for_run(dag_id, run_id, timeout_s)
    for task, task_state in api.task_states(dag_id, run_id).items():
        print(f"  {task}: {task_state}")
    airflow = state.services["airflow"].url
    print(f"\nDAG run {run_id}: {result}")
    champion = _champion(state.services["mlflow"].url, "digits-classifier")
    if champion is not None:
        print(
            f"Promoted model: digits-classifier version {champion} is @champion. Load it with\n"
            f'  MLFLOW_TRACKING_URI={state.services["mlflow"].url} {sys.executable} -c "import '
            "mlflow.pyfunc; m = mlflow.pyfunc.load_model('models:/digits-classifier@champion')"
            '"'
        )
    told = result == "success" and team_demo(state, api)
    print(
        f"\nAirflow UI: {airflow}/dags/{dag_id}  (login {state.airflow_user} / "
        f"{state.airflow_password})"
    )
    print(f"tideflow page: {airflow}/tideflow/  (teams, queue, preemption journal, broker)")
    print(f"MLflow UI:  {state.services['mlflow'].url}")
    print(f"S3 (SeaweedFS): {state.services['s3'].url}  buckets: tideflow, mlflow")
    print("Stop everything with: make down")
    return 0 if result == "success" and told else 1


def _champion(mlflow_url: str, model: str) -> str | None:
    """The version behind the model's champion alias, from MLflow's REST API."""
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(
            f"{mlflow_url}/api/2.0/mlflow/registered-models/alias?name={model}&alias=champion",
            timeout=30,
        ) as response:
            return str(json.loads(response.read())["model_version"]["version"])
    except (urllib.error.URLError, KeyError, ValueError):
        return None


def cluster_command(command: str, home: Path) -> int:
    """``cluster``: build (once per version) and start the local Kubernetes cluster."""
    from tideflow.stack.cluster import lifecycle

    if command == "cluster-down":
        lifecycle.down(home)
        print("local Kubernetes cluster stopped")
        return 0
    state = lifecycle.up(home, say=lambda line: print(line, flush=True))
    print("local Kubernetes cluster is up:\n" + lifecycle.describe(state))
    print(f"  try: KUBECONFIG={state.admin} kubectl get nodes")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tideflow.stack", description="Local S3 + MLflow + Airflow on 127.0.0.1."
    )
    parser.add_argument(
        "command", choices=["up", "down", "status", "demo", "cluster", "cluster-down"]
    )
    parser.add_argument(
        "--home",
        type=Path,
        default=None,
        help="state directory (default: $TIDEFLOW_HOME or ./.tideflow)",
    )
    parser.add_argument("--dag", default="digits", help="DAG the demo triggers")
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for the run")
    args = parser.parse_args(argv)
    home = (args.home or default_home()).resolve()
    try:
        if args.command == "up":
            print(describe(up(home)))
        elif args.command == "down":
            down(home)
            print("tideflow local stack stopped")
        elif args.command.startswith("cluster"):
            return cluster_command(args.command, home / "cluster")
        elif args.command == "status":
            state = StackState.load(home)
            print(describe(state) if state and state.services else "not running")
        else:
            return demo(home, args.dag, args.timeout)
    except (StackError, AirflowApiError) as exc:
        print(f"tideflow stack: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
