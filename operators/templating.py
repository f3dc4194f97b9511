"""Render step templates to typed values without guessing types from text.

Airflow's native rendering (``render_template_as_native_obj``) passes every
rendered string through ``ast.literal_eval``: a string param ``"[1, 2, 3]"``
becomes a list, ``"{{ params.seed }}0"`` an int, and it renders in Jinja's
unsandboxed environment. tideflow renders in Airflow's sandboxed environment
instead, with one rule: a template that is a single expression
(``"{{ params.seed }}"``, ``"{{ ti.xcom_pull(...)['train'] }}"``) keeps the
value's own type (an int param stays an int, a string stays a string); any
text around or between expressions makes a string. Nothing is ever parsed.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from itertools import chain, islice
from typing import Any

import jinja2
import jinja2.nativetypes
from airflow.sdk.definitions._internal.templater import SandboxedEnvironment


def typed_concat(nodes: Iterable[Any]) -> Any:
    """One rendered node: that value as it is; several: their text joined."""
    iterator = iter(nodes)
    head = list(islice(iterator, 2))
    if not head:
        return None
    if len(head) == 1:
        return head[0]
    return "".join(str(part) for part in chain(head, iterator))


class TypedSandboxedEnvironment(SandboxedEnvironment):
    """Airflow's sandboxed environment, compiled to yield values rather than text."""

    code_generator_class = jinja2.nativetypes.NativeCodeGenerator
    concat = staticmethod(typed_concat)


def template_env() -> jinja2.Environment:
    # the settings Airflow gives a DAG's environment: strict undefined, `do`, no cache
    return TypedSandboxedEnvironment(
        undefined=jinja2.StrictUndefined, extensions=["jinja2.ext.do"], cache_size=0
    )


def render_typed(template: jinja2.Template, context: Any) -> Any:
    """Render ``template`` with an Airflow task context, as Airflow does, typed as above."""
    context = copy.copy(context)
    env = template.environment
    if template.globals:
        context.update((k, v) for k, v in template.globals.items() if k not in context)
    try:
        nodes = template.root_render_func(
            env.context_class(env, context, template.name, template.blocks)
        )
        return typed_concat(nodes)
    except Exception:
        env.handle_exception()  # points the traceback at the template
        raise
