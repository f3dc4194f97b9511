"""Evaluation placement: NPU first, then a spare GPU, then the CPU if allowed, else wait.

Against a declared inventory of one NPU node and one GPU node; this machine has
neither, so the chosen devices run emulated on the CPU (and say so).
"""

from __future__ import annotations

import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.scored_runs import KEEP_BEST, SCORES, run_pipeline, scored_pipeline, step_run, xcom_of
from tideflow.config import Settings
from tideflow.inventory import inventory_for
from tideflow.scheduling import (
    DeviceChoice,
    GangRequest,
    Lease,
    LeaseLedger,
    Refusal,
    choose_device,
)
from tideflow.scheduling.preference import SPARE_PRIORITY

CLUSTER = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: mixed}
nodes:
  - {name: ascend, cpu: 16, accelerators: {class: npu, model: Ascend910, count: 1}}
  - {name: h100, cpu: 16, accelerators: {class: gpu, model: H100, count: 2}}
"""


@pytest.fixture
def cluster_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER)
    monkeypatch.setenv("TIDEFLOW_CLUSTER_FILE", str(path))
    monkeypatch.setenv("TIDEFLOW_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return path


def ledger(cluster_file: Path) -> LeaseLedger:
    return LeaseLedger(Settings.from_env().home / "leases.db", inventory_for(str(cluster_file)))


def hold(book: LeaseLedger, gang: str, device_class: str, count: int) -> Lease:
    lease = book.try_acquire(
        GangRequest(gang, "train", device_class, None, count, 1),  # type: ignore[arg-type]
        "test",
        600,
    )
    assert isinstance(lease, Lease)
    return lease


def choose(book: LeaseLedger, devices: tuple[str, ...]) -> DeviceChoice | Refusal:
    return choose_device(book, devices, gang_id="eval", team="vision", holder="t", ttl_s=60)


def test_npu_free_takes_the_npu(cluster_file: Path) -> None:
    choice = choose(ledger(cluster_file), ("npu", "gpu-spare", "cpu"))
    assert isinstance(choice, DeviceChoice) and choice.device_class == "npu"
    assert choice.lease is not None and choice.lease.nodes == ("ascend",)


def test_npu_busy_and_an_idle_gpu_takes_a_spare_lease(cluster_file: Path) -> None:
    book = ledger(cluster_file)
    hold(book, "npu-user", "npu", 1)
    hold(book, "trainer", "gpu", 1)
    choice = choose(book, ("npu", "gpu-spare", "cpu"))
    assert isinstance(choice, DeviceChoice) and choice.preference == "gpu-spare"
    assert choice.lease is not None and choice.lease.priority == SPARE_PRIORITY
    assert choice.lease.preemptible and choice.lease.placements[0].devices == (1,)


def test_everything_leased_falls_back_to_cpu_only_if_allowed(cluster_file: Path) -> None:
    book = ledger(cluster_file)
    hold(book, "npu-user", "npu", 1)
    hold(book, "trainer", "gpu", 2)
    choice = choose(book, ("npu", "gpu-spare", "cpu"))
    assert isinstance(choice, DeviceChoice) and choice.device_class == "cpu"
    assert choice.lease is None
    waiting = choose(book, ("npu", "gpu-spare"))
    assert isinstance(waiting, Refusal) and not waiting.never


def test_a_spare_lease_never_jumps_ahead_of_a_waiting_training_gang(cluster_file: Path) -> None:
    book = ledger(cluster_file)
    blocker = hold(book, "blocker", "gpu", 2)
    queued = book.try_acquire(GangRequest("queued", "train", "gpu", None, 1, 1), "t", 600)
    assert isinstance(queued, Refusal)
    book.release(blocker.lease_id)
    spare = choose(book, ("gpu-spare",))
    assert isinstance(spare, Refusal) and "queued waits ahead of it" in spare.reason


def test_no_such_device_anywhere_is_final(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEFLOW_CLUSTER_FILE", "")
    book = LeaseLedger(tmp_path / "l.db", inventory_for(None))  # this machine: CPU only
    refusal = choose(book, ("npu", "gpu-spare"))
    assert isinstance(refusal, Refusal) and refusal.never


def run_eval_dag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, devices: str) -> Any:
    from tideflow.compile.dag_plan import compile_dag_plan
    from tideflow.dag.builder import build_dag
    from tideflow.spec import load_pipeline

    path = tmp_path / "eval.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        apiVersion: tideflow/v1
        kind: Pipeline
        metadata: {{name: eval-test, team: vision}}
        steps:
          - name: evaluate
            evaluation:
              entrypoint: tests.step_entrypoints:report_device
              devices: {devices}
              metrics: [accuracy, loss]
        """)
    )
    monkeypatch.setenv("TIDEFLOW_PIPELINES_DIR", str(path))
    dag = build_dag(compile_dag_plan(load_pipeline(path)))
    dag.tasks[0].poll_s = 0.5
    return dag.test()


def xcom(dag_run: Any) -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(
            XComModel.get_many(
                run_id=dag_run.run_id,
                dag_ids=dag_run.dag_id,
                task_ids="evaluate",
                key="return_value",
            )
        ).first()
        return XComModel.deserialize_value(row)


@pytest.mark.processes
@pytest.mark.usefixtures("airflow_home")
def test_operator_runs_on_the_emulated_npu_and_releases_it(
    cluster_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    dag_run = run_eval_dag(tmp_path, monkeypatch, "[npu, gpu-spare, cpu]")
    assert str(dag_run.state) == "success"
    result = xcom(dag_run)
    assert result["metrics"] == {"accuracy": 0.5, "loss": 1.0}
    assert result["device"] == "npu:ascend/0 (npu, emulated on the CPU)"
    assert "device class npu, emulated 1" in capfd.readouterr().out
    assert ledger(cluster_file).leases() == []


@pytest.mark.processes
@pytest.mark.usefixtures("airflow_home")
def test_operator_waits_deferred_until_a_device_frees(
    cluster_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    book = ledger(cluster_file)
    npu = hold(book, "npu-user", "npu", 1)
    gpus = hold(book, "trainer", "gpu", 2)

    def free_gpu_later() -> None:
        time.sleep(3)
        book.release(gpus.lease_id)

    thread = threading.Thread(target=free_gpu_later)
    thread.start()
    dag_run = run_eval_dag(tmp_path, monkeypatch, "[npu, gpu-spare]")
    thread.join()
    assert str(dag_run.state) == "success"
    assert xcom(dag_run)["device"].startswith("gpu:h100/")
    assert [lease.lease_id for lease in book.leases()] == [npu.lease_id]


@pytest.mark.processes
@pytest.mark.usefixtures("airflow_home")
def test_on_kubernetes_the_pod_has_the_device_and_the_ledger_is_not_used(
    cluster_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With TIDEFLOW_BACKEND=kubernetes the task pod is made with the device (the scheduler
    waits for it), so the operator evaluates at once on the first preference the cluster has,
    even with every device of the ledger held, and takes no lease."""
    book = ledger(cluster_file)
    held = [hold(book, "npu-user", "npu", 1), hold(book, "trainer", "gpu", 2)]
    monkeypatch.setenv("TIDEFLOW_BACKEND", "kubernetes")
    dag_run = run_eval_dag(tmp_path, monkeypatch, "[npu, gpu-spare]")
    assert str(dag_run.state) == "success"
    assert xcom(dag_run)["device"] == "cpu (npu, emulated on the CPU)"
    assert {lease.lease_id for lease in book.leases()} == {h.lease_id for h in held}


# -- which checkpoint is evaluated -------------------------------------------------------------


CHOICES = [
    # the default: the best by the gang's keep_best, not its newest
    pytest.param(
        ("eval-best", KEEP_BEST, ""),
        (20, "best", "best by val_accuracy (max): 0.9510 at step 20"),
        id="default-best",
    ),
    pytest.param(
        ("eval-latest", KEEP_BEST, "checkpoint: latest"),
        (30, "latest", "the step asks for the latest checkpoint"),
        id="latest",
    ),
    pytest.param(
        ("eval-unranked", "", "checkpoint: best"),
        (30, "latest", "the gang step declares no checkpoint.keep_best"),
        id="best-without-keep-best",
    ),
]


@pytest.mark.processes
@pytest.mark.usefixtures("airflow_home")
@pytest.mark.parametrize(("pipeline", "expected"), CHOICES)
def test_the_evaluation_scores_the_checkpoint_its_checkpoint_field_names(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    pipeline: tuple[str, str, str],
    expected: tuple[int, str, str],
) -> None:
    """On Airflow: the entry point gets that checkpoint, the step's MLflow run records the
    choice, the step and why, and the XCom hands both to promotion."""
    name, keep_best, evaluation = pipeline
    step, selected, says = expected
    path = scored_pipeline(tmp_path, name, keep_best=keep_best, evaluation=evaluation)
    dag_run = run_pipeline(path, monkeypatch)
    assert str(dag_run.state) == "success"
    result = xcom_of(dag_run, "evaluate")
    assert result["checkpoint_step"] == step
    assert result["checkpoint"].endswith(f"/step-{step:012d}/MANIFEST.json")
    assert result["metrics"]["accuracy"] == SCORES[step // 10 - 1]
    choice = "latest" if "latest" in evaluation else "best"
    assert result["checkpoint_selection"]["choice"] == choice
    assert result["checkpoint_selection"]["selected"] == selected
    assert says in result["checkpoint_selection"]["reason"]

    # the gang step's run carries its device-hours from the ledger (cost attribution)
    train = step_run(name, "train", dag_run.run_id).data.tags
    assert float(train["tideflow.device_hours.own"]) > 0
    assert float(train["tideflow.device_hours.borrowed"]) == 0  # no teams declared
    assert float(train["tideflow.device_hours.lost"]) == 0

    tags = step_run(name, "evaluate", dag_run.run_id).data.tags
    assert tags["tideflow.checkpoint"] == result["checkpoint"]
    assert tags["tideflow.checkpoint_step"] == str(step)
    assert tags["tideflow.checkpoint_choice"] == choice
    assert tags["tideflow.checkpoint_selected"] == selected
    assert says in tags["tideflow.checkpoint_reason"]
