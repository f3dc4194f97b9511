"""The pipeline's own modules on the search path of every step process.

A pipeline's ``code.path`` (``tideflow.spec.models.Code``) is put first on
``PYTHONPATH`` of each process a step starts: data prep, evaluation and the
promotion builder (``tideflow.steps.entrypoints``), and every gang worker, on
this machine from the resolved directory, in pods on a cluster from
``code.image_path``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

PYTHONPATH = "PYTHONPATH"


def with_code_path(
    env: Mapping[str, str], code_path: str | None, inherited: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``env`` with ``code_path`` first on ``PYTHONPATH``.

    Before the step's own ``PYTHONPATH`` when its ``env`` sets one (that replaces
    the inherited one, as any variable of ``env`` does), else before the one the
    process inherits (``inherited``, default ``os.environ``).
    """
    merged = dict(env)
    if not code_path:
        return merged
    rest = env.get(PYTHONPATH)
    if rest is None:
        rest = (os.environ if inherited is None else inherited).get(PYTHONPATH, "")
    parts = [code_path, *(part for part in rest.split(os.pathsep) if part and part != code_path)]
    merged[PYTHONPATH] = os.pathsep.join(parts)
    return merged
