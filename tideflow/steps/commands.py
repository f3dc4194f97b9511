"""Command lines of steps: ``python`` means the interpreter tideflow runs under."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any


def resolve_command(command: Sequence[object]) -> list[str]:
    """Stringify, and map a leading ``python``/``python3`` to ``sys.executable``.

    Pipelines are written once but run under different interpreters (a laptop
    venv, an Airflow worker image); the interpreter on PATH is often not the
    one that has the project installed.
    """
    parts = [str(part) for part in command]
    if parts and parts[0] in ("python", "python3"):
        parts[0] = sys.executable
    return parts


def args_argv(args: Mapping[str, Any]) -> list[str]:
    """A gang command's ``args`` as the options appended to its command line.

    By key, sorted (every backend gives the same line, an Argo step's config
    included, whose keys arrive sorted): ``--KEY VALUE`` for a string or a number
    (``str()`` of it), ``--KEY`` alone for true, nothing for false or null, and
    a list or a mapping as its JSON text (``--KEY '[1, 2]'``).
    """
    argv: list[str] = []
    for key, value in sorted(args.items()):
        if value is True:
            argv.append(f"--{key}")
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple, dict)):
            argv += [f"--{key}", json.dumps(value, sort_keys=True, default=str)]
        else:
            argv += [f"--{key}", str(value)]
    return argv
