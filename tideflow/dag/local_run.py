"""Run one pipeline once through Airflow's ``dag.test()``: no scheduler, no webserver.

Airflow reads its configuration when first imported, so ``airflow_env`` must be
applied before anything imports Airflow; ``run_pipeline`` does it in order.

``tideflow run`` runs it in a child process (``python -m tideflow.dag.local_run``)
and turns Ctrl-C and SIGTERM into one SIGINT for that child: Airflow's task runner
takes SIGTERM over for the task's ``on_kill``, while SIGINT reaches the run as
``KeyboardInterrupt``, on which its gangs are stopped and their leases freed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from tideflow.dag.loader import LOADER_SOURCE


def airflow_env(home: Path, pipeline: Path) -> dict[str, str]:
    """Environment for a private Airflow home whose only DAGs are ``pipeline``'s."""
    dags = home / "dags"
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "TIDEFLOW_PIPELINES_DIR": str(pipeline.resolve()),
    }


def prepare_home(home: Path) -> None:
    """Create the DAG folder and the SQLite metadata DB once."""
    dags = home / "dags"
    dags.mkdir(parents=True, exist_ok=True)
    loader = dags / "tideflow_pipelines.py"
    if not loader.exists() or loader.read_text(encoding="utf-8") != LOADER_SOURCE:
        loader.write_text(LOADER_SOURCE, encoding="utf-8")
    if not (home / "airflow.db").exists():
        airflow = Path(sys.executable).with_name("airflow")
        command = [str(airflow)] if airflow.exists() else [sys.executable, "-m", "airflow"]
        done = subprocess.run(
            [*command, "db", "migrate"],
            env={**os.environ},
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed:\n{done.stdout}\n{done.stderr}")


def run_pipeline(pipeline: Path, conf: dict[str, Any], home: Path) -> tuple[str, list[str]]:
    """Run the pipeline's DAG once; its final state ('success' or 'failed') and the steps
    that failed."""
    os.environ.update(airflow_env(home, pipeline))
    prepare_home(home)
    from tideflow.compile.dag_plan import compile_dag_plan
    from tideflow.dag.builder import build_dag
    from tideflow.spec import load_pipeline

    spec = load_pipeline(pipeline)
    dag = build_dag(compile_dag_plan(spec), pipeline)
    try:
        dag_run = dag.test(run_conf=conf)
        if INTERRUPTED.is_set():
            # Airflow's task runner turns a KeyboardInterrupt inside a task into that
            # task's failure (it catches BaseException) and the run goes on to its end:
            # it was an interrupt all the same.
            raise KeyboardInterrupt
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (cmd_run turns it into this)
        for line in stop_run_gangs(dag.dag_id, [s.name for s in spec.steps if s.gang_training]):
            print(f"tideflow: interrupted: {line}", file=sys.stderr, flush=True)
        raise
    failed = sorted(ti.task_id for ti in dag_run.get_task_instances() if ti.state == "failed")
    return str(dag_run.state), failed


def stop_run_gangs(dag_id: str, gang_steps: list[str]) -> list[str]:
    """Stop the gangs of the newest run of ``dag_id`` and any gang this process holds:
    their workers and supervisors stop, their leases and queue places are freed."""
    from airflow.models.dagrun import DagRun

    from tideflow.backends.local import LocalBackend
    from tideflow.config import Settings
    from tideflow.gangs import gang_id_for, holder_name, open_ledger
    from tideflow.gangs.control import stop_gang, stop_gangs_of

    settings = Settings.from_env()
    ledger = open_ledger(settings.ledger_path, settings.cluster)
    backend = LocalBackend(settings.gangs_dir)
    runs = sorted(DagRun.find(dag_id=dag_id), key=lambda run: str(run.run_after))
    done = stop_gangs_of(holder_name(), ledger, backend)
    if runs:
        run_id = runs[-1].run_id
        done += [
            stop_gang(gang_id_for(dag_id, run_id, step), ledger, backend) for step in gang_steps
        ]
    return done


INTERRUPTED = threading.Event()  # set by the first SIGINT, whoever catches its exception


def _on_interrupt(signum: int, frame: object) -> None:
    INTERRUPTED.set()
    raise KeyboardInterrupt


def run_interruptibly(pipeline: Path, conf: dict[str, Any], home: Path) -> int:
    """``run_pipeline`` in a child process; 0 on success, 1 on failure, 130 interrupted."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tideflow.dag.local_run",
            str(pipeline),
            str(home),
            json.dumps(conf),
        ],
        # its own session: a terminal's Ctrl-C reaches it once, from here, not twice
        start_new_session=True,
    )

    def forward(signum: int, frame: object) -> None:
        child.send_signal(signal.SIGINT)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def main(argv: list[str]) -> int:
    pipeline, home, conf = Path(argv[0]), Path(argv[1]), json.loads(argv[2])
    signal.signal(signal.SIGINT, _on_interrupt)
    from tideflow.spec import load_pipeline

    name = load_pipeline(pipeline).metadata.name
    try:
        state, failed = run_pipeline(pipeline, conf, home)
    except KeyboardInterrupt:
        print(f"pipeline {name}: interrupted", flush=True)
        return 130
    steps = f" (failed step{'s' if len(failed) > 1 else ''}: {', '.join(failed)})" if failed else ""
    print(f"pipeline {name}: {state}{steps}", flush=True)
    return 0 if state == "success" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
