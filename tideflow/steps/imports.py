"""Do a pipeline's ``module:function`` entry points import where its steps would import them?

``tideflow validate`` asks, for every data prep, gang and evaluation entry
point and the promotion's builder, whether the module imports and has the
function, with the pipeline's code (``code.path`` first on ``PYTHONPATH``, as
every step process gets it) and this environment's installed packages. The
imports run in a child process (``python -m tideflow.steps.imports``, the
entry points as JSON on stdin, the errors as JSON on stdout), so the
pipeline's modules, and whatever they import at their top, never load into
the caller, and a module that hangs or crashes cannot take it down.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import traceback
from collections.abc import Sequence
from typing import Any

from tideflow.spec.errors import SpecIssue
from tideflow.spec.models import PipelineSpec
from tideflow.spec.report import did_you_mean
from tideflow.spec.step_kinds import Evaluation, PromoteCheckpoint
from tideflow.spec.yamlpos import Path, Positions, format_path
from tideflow.steps.code import with_code_path

IMPORT_TIMEOUT_S = 300.0
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep


def module_entrypoints(spec: PipelineSpec) -> list[tuple[Path, str]]:
    """Every ``module:function`` the pipeline's steps call, with the path of its field."""
    found: list[tuple[Path, str]] = []
    for index, step in enumerate(spec.steps):
        body = step.body
        field = "builder" if step.kind == "promote_checkpoint" else "entrypoint"
        value = getattr(body, field)
        if isinstance(value, str):
            found.append((("steps", index, step.kind, field), value))
    return found


def contract_calls(spec: PipelineSpec) -> list[tuple[str, str, str, list[str]]]:
    """(field, entry point, role, the step's arg names) of each evaluation and builder:
    tideflow calls them with the arguments ``tideflow.steps.contracts`` defines."""
    calls = []
    for index, step in enumerate(spec.steps):
        body = step.body
        if isinstance(body, Evaluation) and isinstance(body.entrypoint, str):
            path: Path = ("steps", index, step.kind, "entrypoint")
            calls.append((format_path(path), body.entrypoint, "evaluation", sorted(body.args)))
        if isinstance(body, PromoteCheckpoint) and isinstance(body.builder, str):
            path = ("steps", index, step.kind, "builder")
            calls.append((format_path(path), body.builder, "builder", sorted(body.args)))
    return calls


def import_errors(
    entrypoints: list[str],
    packages: list[str],
    code_path: str | None,
    *,
    calls: Sequence[tuple[str, str, str, list[str]]] = (),
    timeout_s: float = IMPORT_TIMEOUT_S,
) -> dict[str, str]:
    """For each entry point and package that does not import, why (``Type: message``);
    for each of ``calls`` (keyed by its field) whose function cannot take the arguments
    tideflow passes, why.

    The child is this interpreter with ``code_path`` first on ``PYTHONPATH``, as a
    step's process is, started in ``/`` so that the caller's working directory
    (which no step shares) finds nothing.
    """
    request = json.dumps(
        {"entrypoints": entrypoints, "packages": packages, "calls": [list(c) for c in calls]}
    )
    env = {**os.environ, **with_code_path({}, code_path), "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tideflow.steps.imports"],
            input=request,
            capture_output=True,
            text=True,
            env=env,
            cwd=os.path.abspath(os.sep),
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        reason = f"importing did not finish within {timeout_s:.0f}s"
        return dict.fromkeys([*entrypoints, *packages], reason)
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        tail = " ".join(done.stderr.strip().splitlines()[-3:]) or f"exit code {done.returncode}"
        return dict.fromkeys([*entrypoints, *packages], f"the import check crashed: {tail}")
    return {str(k): str(v) for k, v in answer.items() if v}


def import_issues(spec: PipelineSpec, file: str, positions: Positions) -> list[SpecIssue]:
    """A located problem for each entry point (and ``code.package``) that does not import."""
    entrypoints = module_entrypoints(spec)
    package = spec.code.package if spec.code is not None else None
    if not entrypoints and package is None:
        return []
    code_dir = spec.code_dir()
    code_path = str(code_dir) if code_dir is not None else None
    calls = contract_calls(spec)
    errors = import_errors(
        sorted({value for _, value in entrypoints}),
        [package] if package else [],
        code_path,
        calls=calls,
    )
    where = f"code.path {code_path}" if code_path else "no code.path"
    accepted = (
        f"a module:function that imports with the pipeline's code ({where}) or from an "
        "installed package; set code.path to the directory that holds the module"
    )

    def issue(path: Path, field: str, problem: str, accepted: str) -> SpecIssue:
        line, col = positions.of_value(path)
        return SpecIssue(file, line, col, field, problem, accepted)

    issues = [
        issue(path, format_path(path), f"cannot import '{value}': {errors[value]}", accepted)
        for path, value in entrypoints
        if value in errors
    ]
    for field, value, role, _ in calls:
        if value not in errors and field in errors:
            issues.append(
                issue(
                    tuple(_path_of(field, entrypoints)),
                    field,
                    f"'{value}' cannot be called as {'an' if role == 'evaluation' else 'a'} "
                    f"{role}: {errors[field]}",
                    "function(ctx, **arguments) taking the arguments of tideflow.steps.contracts "
                    "(docs/how-to/evaluate-and-promote.md) and the step's args",
                )
            )
    if package is not None and package in errors:
        issues.append(
            issue(
                ("code", "package"),
                "code.package",
                f"cannot import package '{package}': {errors[package]}",
                "a package installed in this environment (pip install it), or "
                "'path: DIR' for a directory of modules next to the pipeline",
            )
        )
    return issues


def _path_of(field: str, entrypoints: list[tuple[Path, str]]) -> Path:
    return next(path for path, _ in entrypoints if format_path(path) == field)


def _check_call(call: list[Any]) -> str:
    from tideflow.steps.contracts import signature_problem

    _, entrypoint, role, arg_names = call
    module_name, _, attr = entrypoint.partition(":")
    function = getattr(importlib.import_module(module_name), attr)
    return signature_problem(function, role, dict.fromkeys(arg_names))


def _check_entrypoint(entrypoint: str) -> str:
    module_name, _, attr = entrypoint.partition(":")
    module = importlib.import_module(module_name)
    if not hasattr(module, attr):
        hint = did_you_mean(attr, (n for n in vars(module) if not n.startswith("_")))
        close = f" ({hint.strip()})" if hint else ""
        return f"module '{module_name}' ({module.__file__}) has no attribute '{attr}'{close}"
    if not callable(getattr(module, attr)):
        return f"'{attr}' in module '{module_name}' is not callable"
    return ""


def _check_package(name: str) -> str:
    if importlib.util.find_spec(name) is None:
        return f"ModuleNotFoundError: No module named '{name}'"
    importlib.import_module(name)
    return ""


def _answer(name: str, check: Any) -> str:
    try:
        return str(check(name))
    except BaseException as exc:  # an entry point's module may raise anything, or exit
        # Where it went wrong in the pipeline's modules (or a package they import), not in
        # the import machinery.
        frames = [
            frame
            for frame in traceback.extract_tb(exc.__traceback__)
            if not frame.filename.startswith(("<", _STDLIB)) and frame.filename != __file__
        ]
        where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        return f"{type(exc).__name__}: {exc}{where}"


def main() -> int:
    request = json.loads(sys.stdin.read())
    answer = {name: _answer(name, _check_entrypoint) for name in request["entrypoints"]}
    answer.update({name: _answer(name, _check_package) for name in request["packages"]})
    for call in request.get("calls", []):
        if not answer.get(call[1]):  # its module imported
            answer[call[0]] = _answer(call, _check_call)
    sys.stdout.flush()
    # The last line is the answer, whatever the imported modules printed before it.
    print("\n" + json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
