"""The digits gang step as a Volcano Job: all-or-nothing (minAvailable = workers), restart
policies, rendezvous, restricted pods, secrets by reference; valid against Volcano's
own CRD schema (../shared/schemas, skipped with the reason where it is absent) and
equal to its golden file (regenerate with TIDEFLOW_UPDATE_GOLDEN=1, never in CI)."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kubefake.schemas import SCHEMAS, crd_schema, validate
from tideflow.backends.kubernetes import gang_object
from tideflow.compile.dag_plan import DagPlan, compile_dag_plan
from tideflow.compile.gang_plan import gang_plan_from_json, gang_plan_to_json
from tideflow.gangs import resolve_gang
from tideflow.kube import KubeSettings, dns_label
from tideflow.spec import load_pipeline

GOLDEN = Path(__file__).parents[1] / "golden" / "digits-train.volcano.yaml"
RUN_ID = "manual__2026-11-23T12:00:00+00:00"


def rendered_plan(repo: Path, **params: Any) -> DagPlan:
    """The plan as the operator sees it at run time: params and upstream outputs filled in."""
    plan = compile_dag_plan(load_pipeline(repo / "pipelines" / "digits.yaml"))
    values = {name: p.default for name, p in plan.params.items()} | params

    def render(value: Any) -> Any:
        if isinstance(value, str):
            whole = re.fullmatch(r"\{\{ params\.(\w+) \}\}", value)
            if whole:
                return values[whole.group(1)]
            value = re.sub(r"\{\{ params\.(\w+) \}\}", lambda m: str(values[m.group(1)]), value)
            return re.sub(
                r"\{\{ ti\.xcom_pull\(task_ids='([\w-]+)'\)\['(\w+)'\] \}\}",
                lambda m: f"s3://tideflow/artifacts/digits/run/{m.group(1)}/{m.group(2)}.npz",
                value,
            )
        if isinstance(value, list):
            return [render(v) for v in value]
        if isinstance(value, dict):
            return {k: render(v) for k, v in value.items()}
        return value

    tasks = tuple(
        replace(
            t,
            config=render(t.config),
            gang=t.gang and gang_plan_from_json(render(gang_plan_to_json(t.gang))),
        )
        for t in plan.tasks
    )
    return type(plan)(**{**plan.__dict__, "tasks": tasks})


def digits_gang_object(repo: Path, settings: KubeSettings, **params: Any) -> dict[str, Any]:
    """The object the operator submits for digits' gang step in run RUN_ID: the step
    resolved as at run time (``resolve_gang``), built by the Kubernetes backend."""
    plan = rendered_plan(repo, **params)
    (train,) = [t for t in plan.tasks if t.kind == "gang_training"]
    assert train.gang is not None
    gang = resolve_gang(
        train.gang,
        pipeline=plan.dag_id,
        team=plan.team,
        run_id=RUN_ID,
        step=train.task_id,
        artifact_root=settings.artifact_root,
        allowed_roots=(settings.artifact_root,),
    )
    return gang_object(gang.cluster_job(), settings)


def job(repo: Path, **params: Any) -> dict[str, Any]:
    return digits_gang_object(repo, KubeSettings(), **params)


def test_digits_gang_is_all_or_nothing_with_gang_restarts(repo: Path) -> None:
    obj = job(repo, workers=2)
    spec = obj["spec"]
    assert spec["minAvailable"] == 2 and spec["tasks"][0]["replicas"] == 2
    assert spec["queue"] == "vision" and spec["maxRetry"] == 3  # 2 restarts, as Volcano counts
    # a preempted gang is aborted (and replaced by the backend), so it uses no restart
    assert {"event": "PodEvicted", "action": "AbortJob"} in spec["policies"]
    assert {"exitCode": 75, "action": "AbortJob"} in spec["policies"]
    assert {"event": "PodFailed", "action": "RestartJob"} in spec["policies"]
    assert {"exitCode": 76, "action": "TerminateJob"} in spec["policies"]
    assert spec["plugins"] == {"svc": [], "env": []}
    pod = spec["tasks"][0]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    name = obj["metadata"]["name"]
    assert env["MASTER_ADDR"] == f"{name}-worker-0.{name}" and env["WORLD_SIZE"] == "2"
    assert container["envFrom"] == [{"secretRef": {"name": "tideflow-store"}}]
    assert not any("SECRET" in e["name"] or "KEY" in e["name"] for e in container["env"])
    assert pod["terminationGracePeriodSeconds"] >= 60  # time to write a checkpoint
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False and context["runAsNonRoot"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "--lr" in container["command"] and "0.05" in container["command"]
    assert job(repo, workers=1)["spec"]["minAvailable"] == 1


def test_gang_pods_run_as_the_gang_service_account_without_a_token_as_mlflow_clients(
    repo: Path,
) -> None:
    from tideflow.kube.pods import MLFLOW_CLIENT_LABEL

    template = job(repo)["spec"]["tasks"][0]["template"]
    assert template["spec"]["serviceAccountName"] == KubeSettings().gang_service_account
    # Gang workers never call the Kubernetes API: no token in their pods.
    assert template["spec"]["automountServiceAccountToken"] is False
    # deploy/kubernetes/mlflow.yaml admits pods with this label only.
    assert template["metadata"]["labels"][MLFLOW_CLIENT_LABEL] == "true"
    assert MLFLOW_CLIENT_LABEL not in job(repo)["metadata"]["labels"]  # the Job is no pod


def test_names_and_labels_are_valid_kubernetes_names(repo: Path) -> None:
    obj = job(repo)
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", obj["metadata"]["name"])
    assert len(obj["metadata"]["name"]) <= 63 - len("-worker-4095")
    for value in obj["metadata"]["labels"].values():
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", value) and len(value) <= 63
    assert dns_label("a/b") != dns_label("a_b")  # lossy names keep a hash of the original


@pytest.mark.skipif(not SCHEMAS.is_dir(), reason=f"no CRD schemas at {SCHEMAS}")
def test_job_validates_against_volcanos_crd_schema(repo: Path) -> None:
    schema = crd_schema("volcano/batch.volcano.sh_jobs.yaml", "v1alpha1")
    assert validate(job(repo), schema) == []
    broken = job(repo)
    broken["spec"]["minAvailable"] = "two"
    broken["spec"]["polices"] = []
    problems = validate(broken, schema)
    assert any("minAvailable" in p for p in problems) and ".spec.polices: unknown field" in problems


def test_job_matches_its_golden_file(repo: Path) -> None:
    text = yaml.safe_dump(job(repo), sort_keys=True)
    if os.environ.get("TIDEFLOW_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "regenerate with TIDEFLOW_UPDATE_GOLDEN=1 and review"
