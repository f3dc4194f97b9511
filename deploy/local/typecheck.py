"""mypy over the configured packages, operators/, plugins/ and dags/, each under its import name.

pip maps the folders operators/ and plugins/ to tideflow.operators and
tideflow.plugins through an import hook, which mypy cannot follow; given to it
as sources with their installed names, they are checked with the rest.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mypy import build
from mypy.main import process_options
from mypy.modulefinder import BuildSource

REPO = Path(__file__).resolve().parents[2]
MAPPED = {"operators": "tideflow.operators", "plugins": "tideflow.plugins"}
DAG_FILES = "dags"


def mapped_sources() -> list[BuildSource]:
    sources = []
    for folder, package in MAPPED.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            sources.append(BuildSource(str(path), name))
    # Airflow imports each DAG file as a top-level module of its own name.
    for path in sorted((REPO / DAG_FILES).glob("*.py")):
        sources.append(BuildSource(str(path), path.stem))
    return sources


def main() -> int:
    sources, options = process_options([])
    result = build.build(sources + mapped_sources(), options)
    for line in result.errors:
        print(line)
    print(f"{len(result.errors)} problems" if result.errors else "typecheck: no issues")
    return 1 if result.errors else 0


if __name__ == "__main__":
    sys.exit(main())
