"""What Argo does with a compiled WorkflowTemplate, done here: resolve variables, run steps.

``variables`` finds every ``{{...}}`` as Argo's substitution does; ``substitute``
fills them in and fails on any it cannot resolve, as Argo's validation would.
``run_locally`` walks the DAG in order: container steps run their command (the
standalone executor) as a child process with the template's environment, and
the gang step runs the Volcano Job's worker command as one rank; each output
parameter is read from the file its ``valueFrom.path`` names. The ``onExit``
template runs last, with ``{{workflow.status}}`` as given.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

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
    **params: Any,
) -> dict[str, str]:
    """Run one DAG task after the ones in ``done``; return its output parameters."""
    (task,) = [t for t in dag_tasks(workflow) if t["name"] == name]
    finished = {
        f"tasks.{upstream}.outputs.parameters.{key}": value
        for upstream, values in done.items()
        for key, value in values.items()
    }
    scope = {"workflow.name": workflow_name, "retries": "0", **defaults(workflow, **params)}
    for argument in (task.get("arguments") or {}).get("parameters", []):
        scope[f"inputs.parameters.{argument['name']}"] = substitute(argument["value"], finished)
    template = templates(workflow)[task["template"]]
    if "resource" in template:
        run_gang(substitute(template["resource"]["manifest"], scope), env)
        return {}
    return run_container(template, scope, scratch / name, env)


def run_container(
    template: dict[str, Any], scope: dict[str, str], folder: Path, env: dict[str, str]
) -> dict[str, str]:
    """Run a container template's command here; return its output parameters."""
    name = template["name"]
    container = template["container"]
    args = [substitute(a, scope) for a in container["args"]]
    args = [str(folder) if a == "/tmp/tideflow/outputs" else a for a in args]
    step_env = {e["name"]: substitute(e["value"], scope) for e in container["env"]}
    finished_run = subprocess.run(
        _python([*container["command"], *args]),
        env={**os.environ, **step_env, **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert finished_run.returncode == 0, (
        f"{name}:\n{finished_run.stdout[-3000:]}\n{finished_run.stderr[-3000:]}"
    )
    return {
        p["name"]: (folder / Path(p["valueFrom"]["path"]).name).read_text()
        for p in (template.get("outputs") or {}).get("parameters", [])
    }


def run_locally(
    workflow: dict[str, Any],
    scratch: Path,
    *,
    workflow_name: str,
    env: dict[str, str],
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


def run_gang(manifest: str, env: dict[str, str]) -> None:
    """One worker of the Volcano Job, as its pod would run it (rank 0 of a gang of one)."""
    job = yaml.safe_load(manifest)
    assert job["spec"]["minAvailable"] == 1, "run the gang with workers=1 here"
    (container,) = job["spec"]["tasks"][0]["template"]["spec"]["containers"]
    pod_env = {e["name"]: e["value"] for e in container["env"]}
    pod_env |= {"VC_TASK_INDEX": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    done = subprocess.run(
        _python(container["command"]),
        env={**os.environ, **pod_env, **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"gang worker:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
