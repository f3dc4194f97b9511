"""The broker in Airflow: its triggers serialize and resume as a restarted triggerer would,
the tideflow_broker DAG runs through Airflow's real ``dag.test()``, and the capacity
sensor waits until the broker lends GPUs back.

The load is a trace file replayed on the clock; the cluster is a declared
inventory of two 8-GPU nodes (nothing here needs a GPU: no gang runs).
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import pytest

from tests.trigger_helpers import first_event, round_trip

CLUSTER = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: lab}
nodes:
  - {name: h100, count: 2, cpu: 64, accelerators: {class: gpu, model: H100, count: 8}}
"""


@pytest.fixture
def broker_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    trace = tmp_path / "load.csv"
    # One week of steady 100 rps: at 10 rps per GPU inference needs 10 GPUs (2 nodes).
    trace.write_text("start_s,rate_rps\n" + "".join(f"{i * 600},100\n" for i in range(7 * 144)))
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER)
    home = tmp_path / "home"
    monkeypatch.setenv("TIDEFLOW_HOME", str(home))
    monkeypatch.setenv("TIDEFLOW_CLUSTER_FILE", str(cluster))
    monkeypatch.setenv("TIDEFLOW_BROKER_LOAD", f"trace:{trace}")
    monkeypatch.setenv("TIDEFLOW_BROKER_PER_GPU_RPS", "10")
    monkeypatch.setenv("TIDEFLOW_BROKER_NODE_GPUS", "8")
    monkeypatch.setenv("TIDEFLOW_BROKER_SENSE_S", "3")
    monkeypatch.setenv("TIDEFLOW_BROKER_POLL_S", "1")
    return {"home": home, "cluster": cluster, "trace": trace}


def test_load_trigger_fires_when_the_policy_wants_more_inference(
    broker_env: dict[str, Path],
) -> None:
    from dataclasses import asdict

    from tideflow.broker.settings import BrokerSettings
    from tideflow.operators.broker_triggers import BrokerDecisionTrigger

    settings = BrokerSettings.from_env()
    assert settings is not None
    home = broker_env["home"]
    trigger = round_trip(
        BrokerDecisionTrigger(
            settings=asdict(settings),
            ledger_path=str(home / "leases.db"),
            journal_path=str(home / "broker.db"),
            cluster_file=str(broker_env["cluster"]),
            deadline=time.time() + 300,
            poll_s=0.1,
        )
    )
    event = first_event(trigger)
    assert event["status"] == "act" and event["action"] == "grow"
    assert event["inference_gpus"] == 16  # 10 GPUs wanted, in whole 8-GPU nodes


@pytest.mark.processes
def test_dag_test_rebalances_and_the_sensor_then_skips(
    broker_env: dict[str, Path], airflow_home: Path, repo: Path
) -> None:
    from tideflow.dag.broker import broker_dag

    # dag.test() runs the DAG as parsed from the DAG folder: put the broker's DAG file there.
    dag_file = airflow_home / "dags" / "tideflow_broker.py"
    dag_file.write_text((repo / "dags" / "tideflow_broker.py").read_text())
    try:
        _rebalance_through_dag_test(broker_env, broker_dag())
    finally:
        dag_file.unlink()


def _rebalance_through_dag_test(broker_env: dict[str, Path], dag: Any) -> None:
    from tideflow.broker.journal import DecisionJournal
    from tideflow.gangs import open_ledger

    assert dag is not None
    when = dt.datetime(2026, 11, 23, 12, tzinfo=dt.UTC)
    run = dag.test(logical_date=when, run_after=when)
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    assert states == {"sense-load": "success", "rebalance": "success"}
    ledger = open_ledger(broker_env["home"] / "leases.db", str(broker_env["cluster"]))
    reserved = sorted(x.gang_id for x in ledger.leases())
    assert reserved == ["broker/inference/0", "broker/inference/1"]
    (entry,) = DecisionJournal(broker_env["home"] / "broker.db").since(0)
    assert entry.action == "grow" and entry.inference_gpus == 16

    # Load unchanged: the sensor finds nothing to do and the rebalance step is skipped.
    later = when + dt.timedelta(minutes=5)
    again = dag.test(logical_date=later, run_after=later)
    states = {ti.task_id: str(ti.state) for ti in again.get_task_instances()}
    assert states == {"sense-load": "skipped", "rebalance": "skipped"}


def test_capacity_trigger_waits_until_the_broker_lends_capacity(
    broker_env: dict[str, Path],
) -> None:
    from tideflow.gangs import open_ledger
    from tideflow.operators.broker_triggers import CapacityTrigger
    from tideflow.scheduling import GangRequest, Lease

    ledger = open_ledger(broker_env["home"] / "leases.db", str(broker_env["cluster"]))
    held = ledger.try_acquire(
        GangRequest("broker/inference/0", "inference", "gpu", None, 1, 8, 1_000_000, False),
        "broker",
        3600,
    )
    assert isinstance(held, Lease)
    request = {
        "gang_id": "probe",
        "team": "vision",
        "device_class": "gpu",
        "model": None,
        "workers": 2,
        "devices_per_worker": 8,
        "priority": 0,
        "preemptible": True,
    }
    waiting = round_trip(
        CapacityTrigger(
            request=request,
            ledger_path=str(broker_env["home"] / "leases.db"),
            cluster_file=str(broker_env["cluster"]),
            deadline=time.time() - 1,  # already due: the deadline is absolute
            poll_s=0.1,
        )
    )
    assert first_event(waiting)["status"] == "timeout"  # one node is reserved for inference
    ledger.release(held.lease_id)  # the broker lends the node back
    ready = round_trip(
        CapacityTrigger(
            request=request,
            ledger_path=str(broker_env["home"] / "leases.db"),
            cluster_file=str(broker_env["cluster"]),
            deadline=time.time() + 60,
            poll_s=0.1,
        )
    )
    assert first_event(ready) == {"status": "available", "reason": "16 gpu free"}


def test_no_broker_dag_without_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    from tideflow.dag.broker import broker_dag

    monkeypatch.delenv("TIDEFLOW_BROKER_LOAD", raising=False)
    assert broker_dag() is None


PARSE_BROKER_DAG = """
import runpy, sys
dag = runpy.run_path(sys.argv[1])["dag"]
print(dag.dag_id, *sorted(m for m in sys.modules if m.startswith("tideflow")))
"""


@pytest.mark.processes
def test_parsing_the_broker_dag_file_leaves_the_broker_itself_to_the_tasks(
    broker_env: dict[str, Path], repo: Path
) -> None:
    """The DAG processor parses dags/tideflow_broker.py in a new process every
    ``min_file_process_interval`` (10 s in the local stack): the broker's service, its
    ledger and the pipelines' loader load when a task runs, not at every parse."""
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", PARSE_BROKER_DAG, str(repo / "dags" / "tideflow_broker.py")],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    dag_id, *loaded = done.stdout.split()
    assert dag_id == "tideflow_broker"
    assert "tideflow.broker.service" not in loaded
    assert "tideflow.scheduling.ledger" not in loaded
    assert "tideflow.dag.loader" not in loaded


def test_broker_run_once_takes_one_step_and_records_it(
    broker_env: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from tideflow.broker.journal import DecisionJournal
    from tideflow.cli import main

    assert main(["broker", "run", "--once"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("grow: 16 inference GPUs of 16:")
    (entry,) = DecisionJournal(broker_env["home"] / "broker.db").since(0)
    assert entry.action == "grow"
    assert main(["broker", "run", "--once", "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith(
        "dry run (nothing moved): would hold: 16 inference GPUs of 16"
    )


def test_broker_settings_name_what_is_missing(
    broker_env: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tideflow.cli import main

    monkeypatch.delenv("TIDEFLOW_BROKER_PER_GPU_RPS")
    assert main(["broker", "run", "--once"]) == 2
    assert "TIDEFLOW_BROKER_PER_GPU_RPS (unset): accepted: a number > 0" in capsys.readouterr().err
    monkeypatch.setenv("TIDEFLOW_BROKER_NODE_GPUS", "eight")
    monkeypatch.setenv("TIDEFLOW_BROKER_PER_GPU_RPS", "10")
    assert main(["broker", "run", "--once"]) == 2
    assert "TIDEFLOW_BROKER_NODE_GPUS='eight': accepted: a whole number" in capsys.readouterr().err
