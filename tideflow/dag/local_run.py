"""Run one pipeline once through Airflow's ``dag.test()``: no scheduler, no webserver.

Airflow reads its configuration when first imported, so ``airflow_env`` must be
applied before anything imports Airflow; ``run_pipeline`` does it in order.
"""

from __future__ import annotations

import os
import subprocess
import sys
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


def run_pipeline(pipeline: Path, conf: dict[str, Any], home: Path) -> str:
    """Run the pipeline's DAG once; return the final DAG run state ('success' or 'failed')."""
    os.environ.update(airflow_env(home, pipeline))
    prepare_home(home)
    from tideflow.compile.dag_plan import compile_dag_plan
    from tideflow.dag.builder import build_dag
    from tideflow.spec import load_pipeline

    dag = build_dag(compile_dag_plan(load_pipeline(pipeline)), pipeline)
    dag_run = dag.test(run_conf=conf)
    return str(dag_run.state)
