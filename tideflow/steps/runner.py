"""Run a ``module:function`` entry point in its own process.

``python -m tideflow.steps.runner ENTRYPOINT CONTEXT.json ARGS.json OUTPUTS.json``

The operator starts this process so that heavy imports (torch, sklearn) and
crashes stay out of the Airflow worker, and so that output streams line by
line into the task log. The function is called as ``fn(ctx, **args)``; the
mapping it returns (output name -> path or URI) is written to OUTPUTS.json.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tideflow.steps.context import StepContext

EXIT_BAD_ENTRYPOINT = 3
EXIT_BAD_OUTPUTS = 4


def resolve(entrypoint: str) -> Callable[..., Any]:
    module_name, _, attr = entrypoint.partition(":")
    module = importlib.import_module(module_name)
    try:
        function = getattr(module, attr)
    except AttributeError:
        raise ImportError(f"module '{module_name}' has no attribute '{attr}'") from None
    if not callable(function):
        raise TypeError(f"{entrypoint} is not callable")
    return function  # type: ignore[no-any-return]


def main(argv: list[str]) -> int:
    entrypoint, context_file, args_file, outputs_file = argv
    # Gang workers share one command line; each rank writes its own outputs file.
    outputs_file = outputs_file.replace("{rank}", os.environ.get("RANK", "0"))
    ctx = StepContext.from_file(Path(context_file))
    args = json.loads(Path(args_file).read_text(encoding="utf-8"))
    try:
        function = resolve(entrypoint)
    except (ImportError, TypeError) as exc:
        print(f"tideflow: cannot load entry point {entrypoint}: {exc}", file=sys.stderr)
        return EXIT_BAD_ENTRYPOINT
    result = function(ctx, **args)
    outputs = {} if result is None else result
    if not isinstance(outputs, Mapping) or not all(
        isinstance(k, str) and isinstance(v, (str, int, float, bool)) for k, v in outputs.items()
    ):
        print(
            f"tideflow: {entrypoint} must return a mapping of names to strings (paths, URIs) "
            f"or numbers (metrics), got {type(result).__name__}",
            file=sys.stderr,
        )
        return EXIT_BAD_OUTPUTS
    Path(outputs_file).write_text(json.dumps(dict(outputs), sort_keys=True), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
