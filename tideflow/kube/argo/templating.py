"""The pipeline's templates in Argo's syntax (``tideflow.compile.templates``).

A param becomes a workflow parameter. An upstream output becomes an input
parameter of the step, which its DAG task fills from that task's output
parameter; Argo passes outputs along dependencies only, so a step may read
only the steps it needs. A gang step's outputs are its driver's: where the
gang kept its checkpoints, and the newest one when it ended.

A template with no Argo form is recorded as a problem on the context, and the
text is left as it was so that compiling goes on and finds the others.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from tideflow.compile.dag_plan import TaskPlan
from tideflow.compile.templates import (
    OutputRef,
    ParamRef,
    Reference,
    TemplateError,
    exact_param,
    has_template,
    rewrite,
)
from tideflow.kube.argo.context import CompileContext
from tideflow.kube.argo.parameters import value_type
from tideflow.spec.yamlpos import Path


class _RefusedError(Exception):
    """A reference with no Argo form; ``translate`` records it as a problem of the field."""

    def __init__(self, problem: str, accepted: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.accepted = accepted


def output_of(step: str, output: str, inputs: dict[str, str]) -> str:
    """An upstream step's output as this step's input parameter (added to ``inputs``)."""
    name = f"{step}_{output}"  # step names have no '_', so this never collides
    inputs[name] = f"{{{{tasks.{step}.outputs.parameters.{output}}}}}"
    return f"{{{{inputs.parameters.{name}}}}}"


def reference(ctx: CompileContext, ref: Reference, task: TaskPlan, inputs: dict[str, str]) -> str:
    """One reference in Argo's syntax; an upstream output also becomes an entry of ``inputs``."""
    if isinstance(ref, ParamRef):
        return f"{{{{workflow.parameters.{ref.name}}}}}"
    assert isinstance(ref, OutputRef)
    source = ctx.tasks.get(ref.step)
    upstream = sorted(ctx.ancestors(task))
    if source is None or ref.step not in upstream:
        what = "does not exist" if source is None else f"is not upstream of '{task.task_id}'"
        raise _RefusedError(
            f"reads an output of step '{ref.step}', which {what}",
            f"a step that '{task.task_id}' needs, directly or through others "
            f"({', '.join(upstream) or 'none'}); Argo passes outputs along dependencies only",
        )
    outputs = ctx.outputs_of(source)
    if ref.output not in outputs:
        raise _RefusedError(
            f"step '{ref.step}' has no output '{ref.output}'",
            f"one of its outputs: {', '.join(outputs) or 'none'}",
        )
    return output_of(ref.step, ref.output, inputs)


def translate(
    ctx: CompileContext, text: str, path: Path, task: TaskPlan, inputs: dict[str, str]
) -> str | None:
    """``text`` in Argo's template syntax, or None after recording why it has none."""
    try:
        return rewrite(text, lambda ref: reference(ctx, ref, task, inputs))
    except TemplateError as exc:
        ctx.issue(path, exc.problem, exc.accepted)
    except _RefusedError as exc:
        ctx.issue(path, exc.problem, exc.accepted)
    return None


def translate_tree(
    ctx: CompileContext, value: Any, path: Path, task: TaskPlan, inputs: dict[str, str]
) -> Any:
    """Every string in ``value`` translated; one with no Argo form stays as it was."""
    if isinstance(value, str):
        translated = translate(ctx, value, path, task, inputs)
        return value if translated is None else translated
    if isinstance(value, list):
        return [translate_tree(ctx, v, (*path, i), task, inputs) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: translate_tree(ctx, v, (*path, k), task, inputs) for k, v in value.items()}
    return value


def split(
    ctx: CompileContext, doc: dict[str, Any], base: Path, task: TaskPlan, inputs: dict[str, str]
) -> tuple[dict[str, Any], list[str]]:
    """The executor's view of ``doc``: plain JSON, plus ``--set`` for each templated value.

    Templated values leave the JSON (Argo would substitute into it, and a
    quote in a value would break it); each becomes one argument that Argo
    fills in, typed by its param so the entry point sees a number as a number,
    as Airflow's native rendering gives it.
    """
    sets: list[str] = []

    def walk(value: Any, rel: tuple[str | int, ...]) -> Any:
        if isinstance(value, dict):
            return {k: walk(v, (*rel, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, (*rel, i)) for i, v in enumerate(value)]
        if not has_template(value):
            return value
        translated = translate(ctx, value, (*base, *rel), task, inputs)
        name = exact_param(value)
        kind = value_type(ctx.spec.params[name]) if name in ctx.spec.params else "str"
        pointer = "/".join(quote(str(part), safe="") for part in rel)
        if translated is not None:
            sets.extend(["--set", f"{pointer}:{kind}={translated}"])
        return None

    return walk(doc, ()), sets


def step_env(
    ctx: CompileContext, task: TaskPlan, base: Path, inputs: dict[str, str]
) -> dict[str, str]:
    """The step's ``env``, translated, in name order."""
    env = task.config.get("env") or {}
    return {
        k: str(translate_tree(ctx, v, (*base, "env", k), task, inputs))
        for k, v in sorted(env.items())
    }
