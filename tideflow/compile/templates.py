"""The templates a pipeline may use, found in a string and rewritten for another engine.

Airflow renders pipeline templates with Jinja, so in Airflow anything Jinja
accepts works. Other engines have their own syntax: Argo Workflows writes
``{{workflow.parameters.NAME}}`` and ``{{tasks.STEP.outputs.parameters.NAME}}``.
Only the two forms pipelines are documented to use have a counterpart there:

* ``{{ params.NAME }}`` (or ``params['NAME']``): a run parameter;
* ``{{ ti.xcom_pull(task_ids='STEP')['OUTPUT'] }}``: an upstream step's output.

Anything else inside ``{{ }}`` (filters, arithmetic, other variables) and any
``{% %}`` statement or ``{# #}`` comment is refused with what is accepted, so a
pipeline never compiles into a workflow that fails only when it runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

ACCEPTED = (
    "on Argo only '{{ params.NAME }}' and \"{{ ti.xcom_pull(task_ids='STEP')['OUTPUT'] }}\" "
    "(an upstream step's output) are accepted, each alone inside its braces"
)

_BLOCK = re.compile(r"\{\{(.*?)\}\}|\{%|\{#|\{\{", re.S)
_PARAM = re.compile(r"^\s*params\s*(?:\.\s*([A-Za-z_]\w*)|\[\s*(['\"])([A-Za-z_]\w*)\2\s*\])\s*$")
_XCOM = re.compile(
    r"""^\s*ti\s*\.\s*xcom_pull\s*\(\s*task_ids\s*=\s*(['"])([^'"]+)\1\s*\)"""
    r"""\s*\[\s*(['"])([^'"]+)\3\s*\]\s*$"""
)


@dataclass(frozen=True)
class ParamRef:
    name: str


@dataclass(frozen=True)
class OutputRef:
    step: str
    output: str


Reference = ParamRef | OutputRef


class TemplateError(ValueError):
    """A template with no counterpart; ``problem`` says which part, ``accepted`` what would do."""

    def __init__(self, problem: str) -> None:
        super().__init__(f"{problem}; accepted: {ACCEPTED}")
        self.problem = problem
        self.accepted = ACCEPTED


def _parse(expression: str) -> Reference:
    param = _PARAM.match(expression)
    if param:
        return ParamRef(param.group(1) or param.group(3))
    xcom = _XCOM.match(expression)
    if xcom:
        return OutputRef(xcom.group(2), xcom.group(4))
    raise TemplateError(f"unsupported template '{{{{{expression}}}}}'")


def rewrite(text: str, replace: Callable[[Reference], str]) -> str:
    """``text`` with every template replaced by ``replace(reference)``.

    Raises ``TemplateError`` at the first template that has no counterpart.
    """
    out: list[str] = []
    end = 0
    for match in _BLOCK.finditer(text):
        out.append(text[end : match.start()])
        end = match.end()
        if match.group(1) is None:
            token = match.group(0)
            what = {"{%": "a Jinja statement '{% ... %}'", "{#": "a Jinja comment '{# ... #}'"}
            raise TemplateError(what.get(token, "an unclosed '{{'"))
        out.append(replace(_parse(match.group(1))))
    out.append(text[end:])
    return "".join(out)


def references(text: str) -> list[Reference]:
    """Every template in ``text``, in order; raises ``TemplateError`` like ``rewrite``."""
    found: list[Reference] = []

    def keep(reference: Reference) -> str:
        found.append(reference)
        return ""

    rewrite(text, keep)
    return found


def exact_param(text: str) -> str | None:
    """The param's name when ``text`` is one ``{{ params.NAME }}`` and nothing else."""
    match = _BLOCK.fullmatch(text.strip())
    if match is None or match.group(1) is None:
        return None
    param = _PARAM.match(match.group(1))
    return (param.group(1) or param.group(3)) if param else None


def has_template(value: object) -> bool:
    return isinstance(value, str) and any(mark in value for mark in ("{{", "{%", "{#"))
