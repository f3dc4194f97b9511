"""Command lines of steps: ``python`` means the interpreter tideflow runs under."""

from __future__ import annotations

import sys
from collections.abc import Sequence


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
