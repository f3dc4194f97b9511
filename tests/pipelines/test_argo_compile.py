"""`tideflow compile --target argo`: the pipeline as an Argo WorkflowTemplate, through hera.

The emitted object round-trips through hera's generated Argo model, has the
Airflow DAG's steps and dependencies, mirrors the params, runs the gang step
as tideflow's gang driver with its own ServiceAccount (what the driver does on a
cluster is tests/pipelines/test_argo_gang_step.py), places and secures every pod, and
refers only to variables Argo can resolve. Templates
with no Argo form are refused with the file, line, field and what is accepted.
It equals its golden file (regenerate with TIDEFLOW_UPDATE_GOLDEN=1, never in CI).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.argo_run import dag_tasks, templates, variables
from tests.stack.test_cli import tideflow
from tideflow.argo import compile_pipeline, render
from tideflow.compile.dag_plan import compile_dag_plan
from tideflow.compile.templates import OutputRef, ParamRef, TemplateError, references, rewrite
from tideflow.inventory import Inventory, load_cluster
from tideflow.kube import KubeSettings
from tideflow.kube.argo import compile_workflow
from tideflow.spec import SpecError, load_pipeline

GOLDEN = Path(__file__).parents[1] / "golden" / "digits.argo.yaml"
K8S_VERSION = "1.33"


@pytest.fixture(scope="module")
def digits_text(repo: Path) -> str:
    return compile_pipeline(repo / "pipelines" / "digits.yaml", settings=KubeSettings())[1]


@pytest.fixture(scope="module")
def digits(digits_text: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(digits_text)
    return loaded


def write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def pipeline(steps: str, params: str = "  seed: {type: int, default: 1}\n") -> str:
    return (
        "apiVersion: tideflow/v1\nkind: Pipeline\nmetadata: {name: p, team: qa}\n"
        f"params:\n{params}steps:\n{textwrap.dedent(steps)}"
    )


# -- the golden file and purity -------------------------------------------------------------


def test_digits_matches_its_golden_file(digits_text: str) -> None:
    if os.environ.get("TIDEFLOW_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(digits_text)
    assert digits_text == GOLDEN.read_text(), "regenerate with TIDEFLOW_UPDATE_GOLDEN=1 and review"


def test_compiling_is_a_pure_function_of_spec_and_settings(repo: Path) -> None:
    spec = load_pipeline(repo / "pipelines" / "digits.yaml")
    first = render(compile_workflow(spec, settings=KubeSettings()), "digits.yaml")
    again = render(compile_workflow(spec, settings=KubeSettings()), "digits.yaml")
    assert first == again
    elsewhere = KubeSettings(namespace="ml", image="r.example/tideflow:2")
    other = render(compile_workflow(spec, settings=elsewhere), "digits.yaml")
    assert other != first and "namespace: ml" in other and "r.example/tideflow:2" in other


@pytest.mark.processes
def test_the_core_compiler_imports_no_hera() -> None:
    code = (
        "import sys, tideflow.kube.argo, tideflow.compile.templates, tideflow.steps.standalone;"
        "sys.exit(any(m == 'hera' or m.startswith(('hera.', 'airflow')) for m in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# -- hera's model -------------------------------------------------------------------------


def round_trip(obj: dict[str, Any]) -> dict[str, Any]:
    from hera.workflows.models import WorkflowTemplate

    dumped: dict[str, Any] = WorkflowTemplate.model_validate(obj).model_dump(
        by_alias=True, exclude_none=True, mode="json"
    )
    return dumped


def unknown_fields(value: Any, annotation: Any, path: str = "") -> list[str]:
    """Keys of ``value`` that the generated model (``annotation``) has no field for."""
    from pydantic import BaseModel, RootModel

    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return min((unknown_fields(value, a, path) for a in args), key=len)
    if origin is list and isinstance(value, list):
        return [p for i, v in enumerate(value) for p in unknown_fields(v, args[0], f"{path}[{i}]")]
    if origin is dict and isinstance(value, dict):
        return [p for k, v in value.items() for p in unknown_fields(v, args[1], f"{path}.{k}")]
    is_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    if not is_model or issubclass(annotation, RootModel) or not isinstance(value, dict):
        return []
    fields = {(f.alias or name): f for name, f in annotation.model_fields.items()}
    found = []
    for key, item in value.items():
        if key in fields:
            found += unknown_fields(item, fields[key].annotation, f"{path}.{key}")
        else:
            found.append(f"{path}.{key}")
    return found


def test_round_trips_through_heras_generated_model(digits: dict[str, Any]) -> None:
    from hera.workflows.models import WorkflowTemplate

    assert round_trip(digits) == digits
    assert unknown_fields(digits, WorkflowTemplate) == []
    # The generated model ignores unknown fields rather than refusing them, so a
    # misspelled field is found by name, and does not survive the round trip.
    assert WorkflowTemplate.model_config.get("extra") in (None, "ignore")
    broken = copy.deepcopy(digits)
    step = templates(broken)["prepare-data"]
    step["retryStrategi"] = step.pop("retryStrategy")
    step["container"]["securityContext"]["runAsNonRot"] = True
    assert unknown_fields(broken, WorkflowTemplate) == [
        ".spec.templates[1].container.securityContext.runAsNonRot",
        ".spec.templates[1].retryStrategi",
    ]
    assert round_trip(broken) != broken


# -- the DAG and its params -----------------------------------------------------------------


@pytest.mark.usefixtures("airflow_home")
def test_steps_and_dependencies_equal_the_airflow_dags(repo: Path, digits: dict[str, Any]) -> None:
    from tideflow.dag.builder import build_dag

    plan = compile_dag_plan(load_pipeline(repo / "pipelines" / "digits.yaml"))
    argo = {t["name"]: sorted(t.get("dependencies", [])) for t in dag_tasks(digits)}
    assert argo == {t.task_id: sorted(t.upstream) for t in plan.tasks}
    airflow = {t.task_id: sorted(t.upstream_task_ids) for t in build_dag(plan).tasks}
    assert argo == airflow
    # the DAG, one template per step, and the exit handler that closes the MLflow run
    assert digits["spec"]["onExit"] == "pipeline-end"
    assert set(templates(digits)) == {*argo, digits["spec"]["entrypoint"], "pipeline-end"}
    end = templates(digits)["pipeline-end"]["container"]["args"]
    assert end[:2] == ["pipeline_end", "--pipeline"] and "status:str={{workflow.status}}" in end


def test_workflow_parameters_mirror_the_params(tmp_path: Path) -> None:
    params = """\
      lr: {type: float, default: 0.001, description: Learning rate}
      optimizer: {type: enum, values: [sgd, adam], default: adam}
      verbose: {type: bool, default: true}
    """
    path = write(
        tmp_path,
        pipeline(
            """\
            - name: prep
              data_prep:
                entrypoint: tideflow.examples.digits:prepare
                args: {lr: "{{ params.lr }}", optimizer: "{{ params['optimizer'] }}"}
            """,
            textwrap.indent(textwrap.dedent(params), "  "),
        ),
    )
    workflow = yaml.safe_load(compile_pipeline(path, settings=KubeSettings())[1])
    mirrored = {p["name"]: p for p in workflow["spec"]["arguments"]["parameters"]}
    assert mirrored == {
        "lr": {"name": "lr", "value": "0.001", "description": "Learning rate"},
        "optimizer": {"name": "optimizer", "value": "adam", "enum": ["sgd", "adam"]},
        "verbose": {"name": "verbose", "value": "true"},
    }
    args = templates(workflow)["prep"]["container"]["args"]
    assert "args/lr:float={{workflow.parameters.lr}}" in args
    assert "args/optimizer:str={{workflow.parameters.optimizer}}" in args
    assert "verbose:bool={{workflow.parameters.verbose}}" in args


def test_upstream_outputs_flow_through_task_arguments(digits: dict[str, Any]) -> None:
    (train,) = [t for t in dag_tasks(digits) if t["name"] == "train"]
    passed = {p["name"]: p["value"] for p in train["arguments"]["parameters"]}
    assert passed == {
        "prepare-data_train": "{{tasks.prepare-data.outputs.parameters.train}}",
        "prepare-data_validation": "{{tasks.prepare-data.outputs.parameters.validation}}",
    }
    template = templates(digits)["train"]
    assert [p["name"] for p in template["inputs"]["parameters"]] == sorted(passed)
    args = template["container"]["args"]
    assert "entrypoint/4:str={{inputs.parameters.prepare-data_train}}" in args
    prep = templates(digits)["prepare-data"]
    assert prep["outputs"]["parameters"] == [
        {"name": name, "valueFrom": {"path": f"/tmp/tideflow/outputs/{name}"}}
        for name in ("train", "validation")
    ]


def test_every_variable_resolves_in_its_scope(digits: dict[str, Any]) -> None:
    """What Argo's validation checks: each {{...}} names something in scope."""
    declared = {p["name"] for p in digits["spec"]["arguments"]["parameters"]}
    global_scope = {"workflow.name", "workflow.uid"}
    global_scope |= {f"workflow.parameters.{p}" for p in declared}
    outputs = {
        name: {p["name"] for p in (t.get("outputs") or {}).get("parameters", [])}
        for name, t in templates(digits).items()
    }
    ancestors: dict[str, set[str]] = {}
    for task in dag_tasks(digits):
        needs = set(task.get("dependencies", []))
        ancestors[task["name"]] = needs.union(*(ancestors[n] for n in needs))
        offered = {
            f"tasks.{up}.outputs.parameters.{out}"
            for up in ancestors[task["name"]]
            for out in outputs[up]
        }
        for argument in (task.get("arguments") or {}).get("parameters", []):
            assert variables(argument["value"]) <= offered | global_scope, argument
        template = templates(digits)[task["template"]]
        scope = global_scope | {
            f"inputs.parameters.{p['name']}"
            for p in (template.get("inputs") or {}).get("parameters", [])
        }
        if "retryStrategy" in template:
            scope.add("retries")
        body = yaml.safe_dump({k: v for k, v in template.items() if k != "outputs"})
        assert variables(body) <= scope, (task["name"], variables(body) - scope)
    # The exit handler runs outside the DAG: it may also read the workflow's status.
    end = templates(digits)[digits["spec"]["onExit"]]
    scope = global_scope | {"workflow.status"} | ({"retries"} if "retryStrategy" in end else set())
    assert variables(yaml.safe_dump(end)) <= scope


# -- the gang step ----------------------------------------------------------------------------


def argument(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_gang_step_runs_the_driver_as_the_one_step_with_an_api_token(
    digits: dict[str, Any],
) -> None:
    """The driver gets the step as the executor would, the settings its gang is built
    with, and the workflow as the gang's owner; it reports where the checkpoints are,
    and evaluation and promotion read that store from it (one store rule: the driver's)."""
    from tideflow.kube.settings import settings_from_json

    settings = KubeSettings()
    template = templates(digits)["train"]
    container = template["container"]
    assert container["command"] == ["python", "-m", "tideflow.gangs.driver"]
    args = container["args"]
    assert args[0] == "gang_training" and argument(args, "--run-id") == "{{workflow.name}}"
    assert settings_from_json(argument(args, "--kube-settings")) == settings
    assert argument(args, "--owner-name") == "{{workflow.name}}"
    assert argument(args, "--owner-uid") == "{{workflow.uid}}"
    # The gang's size is the workflow parameter's, typed.
    assert "workers:int={{workflow.parameters.workers}}" in args
    assert template["serviceAccountName"] == settings.argo_gang_driver_service_account
    assert template["automountServiceAccountToken"] is True
    assert [p["name"] for p in template["outputs"]["parameters"]] == [
        "checkpoint_store",
        "checkpoint",
        "checkpoint_step",
    ]
    store = "{{inputs.parameters.train_checkpoint_store}}"
    for step in ("evaluate", "promote"):
        assert argument(templates(digits)[step]["container"]["args"], "--checkpoint-store") == store
    (evaluate,) = [t for t in dag_tasks(digits) if t["name"] == "evaluate"]
    assert {
        "name": "train_checkpoint_store",
        "value": "{{tasks.train.outputs.parameters.checkpoint_store}}",
    } in evaluate["arguments"]["parameters"]


def test_gang_size_must_be_a_number_or_an_int_param(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        pipeline(
            """\
            - name: train
              gang_training:
                entrypoint: [python, -m, my.train]
                workers: "{{ params.seed + 1 }}"
            """
        ),
    )
    with pytest.raises(SpecError) as caught:
        compile_pipeline(path, settings=KubeSettings())
    assert "steps[0].gang_training.workers: '{{ params.seed + 1 }}' cannot size" in str(
        caught.value
    )


def test_a_restart_count_set_by_a_parameter_reaches_the_driver_as_a_number(
    tmp_path: Path,
) -> None:
    """The driver's backend turns it into Volcano's maxRetry (restarts + 1), as for
    the operator (tideflow.kube.volcano.volcano_max_retry)."""
    path = write(
        tmp_path,
        pipeline(
            """\
            - name: train
              gang_training:
                entrypoint: [python, -m, my.train]
                workers: 2
                max_restarts: "{{ params.seed }}"
            """
        ),
    )
    workflow = yaml.safe_load(compile_pipeline(path, settings=KubeSettings())[1])
    args = templates(workflow)["train"]["container"]["args"]
    assert "max_restarts:int={{workflow.parameters.seed}}" in args


# -- pods ---------------------------------------------------------------------------------------


def as_pod(template: dict[str, Any]) -> dict[str, Any]:
    """The Pod Argo makes of a container template (the parts tideflow sets)."""
    spec: dict[str, Any] = {"containers": [{"name": "main", **template["container"]}]}
    for key in ("securityContext", "nodeSelector", "tolerations", "affinity", "priorityClassName"):
        if key in template:
            spec[key] = template[key]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


def restricted_problems(pod: dict[str, Any]) -> list[str]:
    """What keeps a pod spec from the "restricted" Pod Security Standard (its main points)."""
    problems = []
    context = pod.get("securityContext") or {}
    for container in pod["containers"]:
        own = container.get("securityContext") or {}
        if own.get("allowPrivilegeEscalation") is not False:
            problems.append("allowPrivilegeEscalation")
        if own.get("capabilities", {}).get("drop") != ["ALL"]:
            problems.append("capabilities")
        if not (own.get("runAsNonRoot") or context.get("runAsNonRoot")):
            problems.append("runAsNonRoot")
        if 0 in (own.get("runAsUser"), context.get("runAsUser")):
            problems.append("root")
        seccomp = own.get("seccompProfile") or context.get("seccompProfile") or {}
        if seccomp.get("type") != "RuntimeDefault":
            problems.append("seccomp")
    return problems


def container_templates(workflow: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: t for n, t in templates(workflow).items() if "container" in t}


def test_every_pod_is_restricted_and_valid_kubernetes(digits: dict[str, Any]) -> None:
    import kubernetes_validate

    steps = container_templates(digits)
    assert set(steps) == {"prepare-data", "train", "evaluate", "promote", "pipeline-end"}
    for template in steps.values():
        pod = as_pod(template)
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
        assert restricted_problems(pod["spec"]) == []
    # The gang's worker pods are admitted by the fake (tests/pipelines/test_argo_gang_step.py).
    broken = as_pod(steps["promote"])
    broken["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    assert restricted_problems(broken["spec"]) == ["allowPrivilegeEscalation"]


def test_workflow_pods_mount_no_token_and_argos_executor_has_its_own(
    digits: dict[str, Any],
) -> None:
    """Step containers never call the Kubernetes API, except the gang driver, which gets
    its own ServiceAccount's token; Argo's executor reports outputs as
    WorkflowTaskResults with its own ServiceAccount, whose token Argo mounts into its
    executor containers only.

    upstream: argo docs/fields.md WorkflowSpec (automountServiceAccountToken: "
    ServiceAccountName of ExecutorConfig must be specified if this value is false";
    executor.serviceAccountName); argo workflow/validate/validate.go refuses the first
    without the second.
    """
    from tideflow.kube.pods import MLFLOW_CLIENT_LABEL

    settings = KubeSettings()
    spec = digits["spec"]
    assert spec["serviceAccountName"] == settings.argo_service_account
    assert spec["automountServiceAccountToken"] is False
    assert spec["executor"] == {"serviceAccountName": settings.argo_executor_service_account}
    tokens = {
        name: (t.get("serviceAccountName"), t.get("automountServiceAccountToken"))
        for name, t in templates(digits).items()
        if "container" in t
    }
    assert tokens.pop("train") == (settings.argo_gang_driver_service_account, True)
    assert set(tokens.values()) == {(None, None)}  # the workflow's: no token
    # Steps report to MLflow; the driver only to the API server.
    for name, template in container_templates(digits).items():
        if name != "train":
            assert template["metadata"]["labels"][MLFLOW_CLIENT_LABEL] == "true", name
    assert MLFLOW_CLIENT_LABEL not in templates(digits)["train"]["metadata"]["labels"]
    names = KubeSettings(argo_service_account="a", argo_executor_service_account="b")
    other = compile_workflow(
        load_pipeline(Path(__file__).parents[2] / "pipelines" / "digits.yaml"), settings=names
    )
    assert (other.service_account, other.executor_service_account) == ("a", "b")


def test_pods_select_their_pool_and_tolerate_its_taint(digits: dict[str, Any]) -> None:
    from tideflow.broker.kubernetes import POOL_LABEL, TAINT_KEY

    toleration = {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
    pools = {}
    for name, template in templates(digits).items():
        if "dag" in template:
            continue
        assert toleration in template["tolerations"], name
        pools[name] = template["nodeSelector"][POOL_LABEL]
    assert pools == {
        "prepare-data": "cpu",
        "train": "cpu",
        "evaluate": "npu",
        "promote": "cpu",
        "pipeline-end": "cpu",
    }
    evaluate = templates(digits)["evaluate"]["container"]
    assert evaluate["resources"]["limits"]["huawei.com/Ascend910"] == "1"


GPU_CLUSTER = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: gpus}
nodes:
  - {name: g, count: 2, cpu: 32, accelerators: {class: gpu, model: H100, count: 8}}
"""


def test_evaluation_on_spare_gpus_takes_the_lowest_priority(repo: Path, tmp_path: Path) -> None:
    """No NPU in the cluster: the next preference, a spare GPU of either pool, preempted first."""
    cluster: Inventory = load_cluster(write(tmp_path, GPU_CLUSTER, "cluster.yaml"))
    text = compile_pipeline(
        repo / "pipelines" / "digits.yaml", settings=KubeSettings(), inventory=cluster
    )[1]
    evaluate = templates(yaml.safe_load(text))["evaluate"]
    assert evaluate["priorityClassName"] == "tideflow-spare"
    assert "nodeSelector" not in evaluate
    (term,) = evaluate["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "tideflow.io/pool", "operator": "In", "values": ["training", "inference"]}
    ]
    container = evaluate["container"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {"name": "TIDEFLOW_DEVICE_CLASS", "value": "gpu"} in container["env"]
    assert "gpu-spare" in container["args"]


def test_store_settings_as_variables_and_credentials_only_by_secret(digits: dict[str, Any]) -> None:
    for name, template in container_templates(digits).items():
        container = template["container"]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["MLFLOW_TRACKING_URI"] == "http://mlflow.tideflow:5000", name
        assert env["TIDEFLOW_ARTIFACT_ROOT"] == "s3://tideflow/artifacts", name
        assert container["envFrom"] == [{"secretRef": {"name": "tideflow-store"}}], name
        assert not [k for k in env if any(s in k for s in ("SECRET", "KEY", "PASSWORD", "TOKEN"))]


def test_retries_and_timeouts_follow_the_steps(digits: dict[str, Any], repo: Path) -> None:
    plan = compile_dag_plan(load_pipeline(repo / "pipelines" / "digits.yaml"))
    for task in plan.tasks:
        template = templates(digits)[task.task_id]
        if task.retries:
            assert template["retryStrategy"] == {"limit": task.retries, "retryPolicy": "Always"}
        else:
            assert "retryStrategy" not in template
        assert template.get("activeDeadlineSeconds") == task.timeout_seconds


# -- templates ------------------------------------------------------------------------------


def test_template_rewriting() -> None:
    text = "--in={{ ti.xcom_pull(task_ids='prep')['train'] }} lr={{params.lr}} {{ params['x'] }}"
    assert references(text) == [OutputRef("prep", "train"), ParamRef("lr"), ParamRef("x")]
    assert rewrite("a {{ params.lr }} b", lambda ref: "<lr>") == "a <lr> b"
    for bad in ("{{ params.lr | float }}", "{{ ds }}", "{% if x %}y{% endif %}", "{{ params.lr"):
        with pytest.raises(TemplateError):
            references(bad)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("{{ params.seed | int }}", "unsupported template '{{ params.seed | int }}'"),
        ("{{ ds }}", "unsupported template '{{ ds }}'"),
        ("{% raw %}x{% endraw %}", "a Jinja statement '{% ... %}'"),
        (
            "{{ ti.xcom_pull(task_ids='later')['out'] }}",
            "reads an output of step 'later', which is not upstream of 'prep'",
        ),
    ],
)
def test_unsupported_templates_are_refused_with_file_line_and_field(
    tmp_path: Path, value: str, problem: str
) -> None:
    path = write(
        tmp_path,
        pipeline(
            f"""\
            - name: prep
              data_prep:
                entrypoint: tideflow.examples.digits:prepare
                args:
                  seed: "{value}"
            - name: later
              needs: [prep]
              data_prep: {{entrypoint: "m:f", outputs: [out]}}
            """
        ),
    )
    with pytest.raises(SpecError) as caught:
        compile_pipeline(path, settings=KubeSettings())
    (issue,) = caught.value.issues
    assert str(issue).startswith(f"{path}:11:13: steps[0].data_prep.args.seed: {problem}; ")
    assert issue.accepted


def test_outputs_a_step_cannot_have_are_refused(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        pipeline(
            """\
            - name: prep
              data_prep: {entrypoint: "m:f", outputs: [train, "bad.name"]}
            - name: train
              needs: [prep]
              gang_training:
                entrypoint: [python, -m, t, "{{ ti.xcom_pull(task_ids='prep')['test'] }}"]
                workers: 1
            - name: evaluate
              needs: [train]
              evaluation:
                entrypoint: "m:f"
                metrics: [accuracy]
                args: {c: "{{ ti.xcom_pull(task_ids='train')['model'] }}"}
            """
        ),
    )
    with pytest.raises(SpecError) as caught:
        compile_pipeline(path, settings=KubeSettings())
    text = str(caught.value)
    assert caught.value.issues[0].file == str(path) and len(caught.value.issues) == 3
    assert "steps[0].data_prep.outputs[1]: output name 'bad.name' is not an Argo" in text
    assert "steps[1].gang_training.entrypoint[3]: step 'prep' has no output 'test'" in text
    assert "one of its outputs: train, bad.name" in text
    assert "steps[2].evaluation.args.c: step 'train' has no output 'model'" in text
    assert "checkpoint_store, checkpoint, checkpoint_step" in text


def test_a_gang_needs_a_command_entry_point(repo: Path) -> None:
    with pytest.raises(SpecError) as caught:
        compile_pipeline(
            repo / "tests" / "data" / "pipelines" / "full.yaml", settings=KubeSettings()
        )
    (issue,) = caught.value.issues
    assert issue.field == "steps[1].gang_training.entrypoint" and issue.line == 27
    assert "module:function" in issue.problem and "a command as a list" in issue.accepted


# -- the command line -------------------------------------------------------------------------


@pytest.mark.processes
def test_cli_writes_the_workflow_template(repo: Path, tmp_path: Path) -> None:
    from tideflow.kube.settings import kube_settings_from_env

    done = tideflow(
        "compile", "--target", "argo", "pipelines/digits.yaml", "-o", str(tmp_path), cwd=repo
    )
    assert done.returncode == 0, done.stderr
    written = tmp_path / "digits.workflowtemplate.yaml"
    assert done.stdout.strip() == f"wrote {written}"
    expected = compile_pipeline(
        repo / "pipelines" / "digits.yaml", settings=kube_settings_from_env()
    )
    assert written.read_text() == expected[1]
    airflow = tideflow("compile", "--target", "airflow", "pipelines/digits.yaml", cwd=repo)
    plan = tideflow("plan", "pipelines/digits.yaml", cwd=repo)
    assert airflow.returncode == 0 and airflow.stdout == plan.stdout


@pytest.mark.processes
def test_cli_reports_an_uncompilable_pipeline_like_validate(repo: Path) -> None:
    done = tideflow("compile", "--target", "argo", "tests/data/pipelines/full.yaml", cwd=repo)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == "tests/data/pipelines/full.yaml: 1 problem"
    assert lines[1].startswith("tests/data/pipelines/full.yaml:27:19: steps[1].gang_training")


# -- schedules ---------------------------------------------------------------------------------


def scheduled(tmp_path: Path, schedule: str) -> Path:
    text = pipeline('- name: prep\n  data_prep: {entrypoint: "m:f", outputs: [out]}\n')
    return write(tmp_path, text.replace("team: qa}", f"team: qa, schedule: '{schedule}'}}"))


@pytest.mark.parametrize(
    ("schedule", "argo"),
    [("0 2 * * 1-5", "0 2 * * 1-5"), ("@daily", "@daily"), ("@quarterly", "0 0 1 */3 *")],
)
def test_a_scheduled_pipeline_gets_a_cron_workflow_that_submits_it(
    tmp_path: Path, schedule: str, argo: str
) -> None:
    from hera.workflows import models as m

    from tideflow.argo import render_cron
    from tideflow.argo import write as write_files

    path = scheduled(tmp_path, schedule)
    plan, _ = compile_pipeline(path, settings=KubeSettings(namespace="ml"))
    text = render_cron(plan, str(path))
    assert text is not None
    cron = yaml.safe_load(text)
    m.CronWorkflow.model_validate(cron)  # Argo's own model of the object
    assert (cron["apiVersion"], cron["kind"]) == ("argoproj.io/v1alpha1", "CronWorkflow")
    assert cron["metadata"]["name"] == "p" and cron["metadata"]["namespace"] == "ml"
    assert cron["spec"]["schedules"] == [argo]
    assert cron["spec"]["timezone"] == "UTC"  # Airflow's default time zone
    assert cron["spec"]["workflowSpec"] == {"workflowTemplateRef": {"name": "p"}}
    written = write_files(path, tmp_path / "out", settings=KubeSettings(namespace="ml"))
    assert [f.name for f in written] == ["p.workflowtemplate.yaml", "p.cronworkflow.yaml"]
    assert written[1].read_text() == text


def test_an_unscheduled_pipeline_gets_no_cron_workflow(repo: Path) -> None:
    from tideflow.argo import render_cron

    plan, _ = compile_pipeline(repo / "pipelines" / "digits.yaml", settings=KubeSettings())
    assert plan.schedule is None and render_cron(plan, "digits.yaml") is None


@pytest.mark.parametrize("schedule", ["@once", "@continuous"])
def test_a_schedule_argo_cannot_run_is_refused(tmp_path: Path, schedule: str) -> None:
    path = scheduled(tmp_path, schedule)
    with pytest.raises(SpecError) as caught:
        compile_pipeline(path, settings=KubeSettings())
    (issue,) = caught.value.issues
    assert str(issue).startswith(
        f"{path}:3:41: metadata.schedule: schedule '{schedule}' has no Argo CronWorkflow form; "
        "a cron expression, one of @hourly, @daily"
    )
