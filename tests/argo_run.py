"""What Argo does with a compiled WorkflowTemplate, done here: resolve variables, run steps.

``variables`` finds every ``{{...}}`` as Argo's substitution does; ``substitute``
fills them in and fails on any it cannot resolve, as Argo's validation would.
``run_locally`` walks the DAG in order: container steps run their command (the
standalone executor) as a child process with the template's environment; each
output parameter is read from the file its ``valueFrom.path`` names. The gang
step's container (tideflow's gang driver) runs the same way, as its
ServiceAccount against the Kubernetes fake (tests/kubefake): once its Volcano
Job exists, the fake's scheduler starts the pods and the Job's one worker runs
here as a child process, its exit code ending the pod. The ``onExit`` template
runs last, with ``{{workflow.status}}`` as given.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.kubefake import KubeFake

REPO = Path(__file__).resolve().parent.parent
VARIABLE = re.compile(r"\{\{([^{}]*)\}\}")


def variables(text: str) -> set[str]:
    return {match.strip() for match in VARIABLE.findall(text)}


def substitute(text: str, scope: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        key = match.group(1).strip()
        if key not in scope:
            raise KeyError(f"unresolved {match.group(0)}")
        return scope[key]

    return VARIABLE.sub(one, text)


def templates(workflow: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in workflow["spec"]["templates"]}


def dag_tasks(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    return list(templates(workflow)[workflow["spec"]["entrypoint"]]["dag"]["tasks"])


def defaults(workflow: dict[str, Any], **params: Any) -> dict[str, str]:
    """``workflow.parameters.*`` at their defaults, some set as a submitter would."""
    values = {p["name"]: p["value"] for p in workflow["spec"]["arguments"]["parameters"]}
    values |= {k: str(v) for k, v in params.items()}
    return {f"workflow.parameters.{k}": v for k, v in values.items()}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _python(command: list[str]) -> list[str]:
    # The image's `python` is this interpreter here.
    return [sys.executable, *command[1:]] if command[0] == "python" else command


def run_task(
    workflow: dict[str, Any],
    name: str,
    scratch: Path,
    *,
    done: dict[str, dict[str, str]],
    workflow_name: str,
    env: dict[str, str],
    cluster: KubeFake | None = None,
    **params: Any,
) -> dict[str, str]:
    """Run one DAG task after the ones in ``done``; return its output parameters.

    A gang step needs ``cluster``: its driver creates the gang there."""
    (task,) = [t for t in dag_tasks(workflow) if t["name"] == name]
    finished = {
        f"tasks.{upstream}.outputs.parameters.{key}": value
        for upstream, values in done.items()
        for key, value in values.items()
    }
    scope = {"workflow.name": workflow_name, "retries": "0", **defaults(workflow, **params)}
    for argument in (task.get("arguments") or {}).get("parameters", []):
        scope[f"inputs.parameters.{argument['name']}"] = substitute(argument["value"], finished)
    scope["workflow.uid"] = f"uid-{workflow_name}"
    template = templates(workflow)[task["template"]]
    if "serviceAccountName" in template:  # the gang driver, the one step that uses the API
        assert cluster is not None, f"{name} drives a gang: give run_task a cluster"
        return run_gang_step(template, scope, scratch / name, env, cluster)
    return run_container(template, scope, scratch / name, env)


def container_command(
    template: dict[str, Any], scope: dict[str, str], folder: Path, env: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """A container template's command line and environment, as its pod would run here."""
    container = template["container"]
    args = [substitute(a, scope) for a in container["args"]]
    args = [str(folder) if a == "/tmp/tideflow/outputs" else a for a in args]
    step_env = {e["name"]: substitute(e["value"], scope) for e in container["env"]}
    return _python([*container["command"], *args]), {**os.environ, **step_env, **env}


def output_parameters(template: dict[str, Any], folder: Path) -> dict[str, str]:
    return {
        p["name"]: (folder / Path(p["valueFrom"]["path"]).name).read_text()
        for p in (template.get("outputs") or {}).get("parameters", [])
    }


def run_container(
    template: dict[str, Any], scope: dict[str, str], folder: Path, env: dict[str, str]
) -> dict[str, str]:
    """Run a container template's command here; return its output parameters."""
    command, full_env = container_command(template, scope, folder, env)
    finished_run = subprocess.run(
        command, env=full_env, cwd=REPO, capture_output=True, text=True, timeout=600, check=False
    )
    assert finished_run.returncode == 0, (
        f"{template['name']}:\n{finished_run.stdout[-3000:]}\n{finished_run.stderr[-3000:]}"
    )
    return output_parameters(template, folder)


def start_gang_driver(
    template: dict[str, Any],
    scope: dict[str, str],
    folder: Path,
    env: dict[str, str],
    cluster: KubeFake,
) -> subprocess.Popen[str]:
    """The gang step's pod: its driver as a child process, with its ServiceAccount's token."""
    from tests.kubefake import service_account

    folder.mkdir(parents=True, exist_ok=True)
    namespace = template_namespace(template)
    identity = service_account(namespace, template["serviceAccountName"])
    kubeconfig = cluster.kubeconfig(folder / "kubeconfig", identity, namespace)
    command, full_env = container_command(template, scope, folder, env)
    return subprocess.Popen(
        command,
        env={**full_env, "KUBECONFIG": str(kubeconfig)},
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def template_namespace(template: dict[str, Any]) -> str:
    """The namespace the driver's gang goes to: its --kube-settings say."""
    import json

    args = template["container"]["args"]
    return str(json.loads(args[args.index("--kube-settings") + 1])["namespace"])


def wait_for_gang(cluster: KubeFake, namespace: str, driver: subprocess.Popen[str]) -> str:
    """The name of the Volcano Job the driver created (waits up to 60 s)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        jobs = cluster.list("batch.volcano.sh/v1alpha1", "Job", namespace)
        if jobs:
            return str(jobs[0]["metadata"]["name"])
        assert driver.poll() is None, f"the driver exited {driver.returncode}: {driver.stdout}"
        time.sleep(0.1)
    raise AssertionError("the driver created no Volcano Job within 60 s")


def run_gang_step(
    template: dict[str, Any],
    scope: dict[str, str],
    folder: Path,
    env: dict[str, str],
    cluster: KubeFake,
) -> dict[str, str]:
    """The gang step on the fake cluster: the driver creates the Job, its one worker runs
    here, the fake's Volcano controller ends the Job, and the driver reports its outputs."""
    driver = start_gang_driver(template, scope, folder, env, cluster)
    namespace = template_namespace(template)
    name = wait_for_gang(cluster, namespace, driver)
    cluster.volcano.pods_running(namespace, name)
    code = run_worker(cluster.volcano.pod(namespace, name), env)
    if code == 0:
        cluster.volcano.pods_succeeded(namespace, name)
    else:
        cluster.volcano.pod_failed(namespace, name, exit_code=code)
    out, _ = driver.communicate(timeout=120)
    assert driver.returncode == 0, f"{template['name']} (driver):\n{out[-3000:]}"
    return output_parameters(template, folder)


def run_locally(
    workflow: dict[str, Any],
    scratch: Path,
    *,
    workflow_name: str,
    env: dict[str, str],
    cluster: KubeFake | None = None,
    **params: Any,
) -> dict[str, dict[str, str]]:
    """Run every step in DAG order, then the exit handler; return each task's outputs."""
    outputs: dict[str, dict[str, str]] = {}
    for task in dag_tasks(workflow):
        outputs[task["name"]] = run_task(
            workflow,
            task["name"],
            scratch,
            done=outputs,
            workflow_name=workflow_name,
            env=env,
            cluster=cluster,
            **params,
        )
    run_exit_handler(workflow, scratch, workflow_name=workflow_name, env=env, status="Succeeded")
    return outputs


def run_exit_handler(
    workflow: dict[str, Any],
    scratch: Path,
    *,
    workflow_name: str,
    env: dict[str, str],
    status: str,
    **params: Any,
) -> None:
    """The ``onExit`` template, as Argo runs it once the DAG has ended with ``status``."""
    template = templates(workflow)[workflow["spec"]["onExit"]]
    scope = {
        "workflow.name": workflow_name,
        "workflow.status": status,
        "retries": "0",
        **defaults(workflow, **params),
    }
    run_container(template, scope, scratch / template["name"], env)


def run_worker(pod: dict[str, Any], env: dict[str, str]) -> int:
    """The worker pod's container, run here as rank 0 of a gang of one; its exit code."""
    from tests.kubefake.pods import container_environment

    (container,) = pod["spec"]["containers"]
    pod_env = container_environment(pod)  # as the kubelet gives it, RANK included
    assert pod_env.get("WORLD_SIZE") == "1", "run the gang with workers=1 here"
    pod_env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    done = subprocess.run(
        _python(container["command"]),
        env={**os.environ, **pod_env, **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        print(f"gang worker exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done.returncode
