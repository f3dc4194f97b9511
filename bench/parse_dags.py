"""How long Airflow takes to parse N pipelines: tideflow's loader versus dag-factory.

    .venv/bin/python bench/parse_dags.py [--pipelines 200] [--repeat 5] [--json]

Both sides get N equivalent pipelines (same DAG ids, tasks, dependencies and
params) and are parsed the way Airflow's DAG processor does it: a fresh Python
process builds a ``DagBag`` for the one DAG file. The time measured is the
``DagBag`` construction inside that process (interpreter start-up and
``import airflow`` excluded, as they are paid once per processor, not per
file). dag-factory's telemetry is switched off so nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 2.0

PROBE = """
import json, sys, time
from airflow.dag_processing.dagbag import DagBag
start = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1])
elapsed = time.perf_counter() - start
print(json.dumps({"seconds": elapsed, "dags": len(bag.dag_ids),
                  "errors": len(bag.import_errors)}))
"""


def shape(index: int) -> list[tuple[str, list[str]]]:
    """Step names and needs; every fourth pipeline has all four kinds."""
    if index % 4 == 0:
        return [
            ("prep", []),
            ("train", ["prep"]),
            ("evaluate", ["train"]),
            ("promote", ["evaluate"]),
        ]
    if index % 4 == 1:
        return [("prep", []), ("train", ["prep"])]
    if index % 4 == 2:
        return [("prep-a", []), ("prep-b", []), ("train", ["prep-a", "prep-b"])]
    return [("prep", [])]


def tideflow_pipeline(index: int) -> str:
    steps = []
    for name, needs in shape(index):
        head = f"  - name: {name}\n    needs: {json.dumps(needs)}\n    retries: 1\n"
        if name.startswith("prep"):
            body = (
                "    data_prep:\n      entrypoint: tideflow.examples.digits:prepare\n"
                '      args: {seed: "{{ params.seed }}"}\n'
            )
        elif name == "train":
            body = (
                "    gang_training:\n      entrypoint: [python, -m, train]\n"
                '      workers: "{{ params.workers }}"\n      device: {class: cpu}\n'
                '      args: {lr: "{{ params.lr }}"}\n'
            )
        elif name == "evaluate":
            body = "    evaluation:\n      entrypoint: pkg.eval:main\n      metrics: [accuracy]\n"
        else:
            body = (
                "    promote_checkpoint:\n      model: model-" + str(index) + "\n"
                "      gate: {metric: accuracy, min_delta: 0.01}\n"
            )
        steps.append(head + body)
    return textwrap.dedent(f"""\
        apiVersion: tideflow/v1
        kind: Pipeline
        metadata: {{name: bench-{index}, team: team-{index % 7}, schedule: null}}
        params:
          lr: {{type: float, default: 0.01, minimum: 0.0, maximum: 1.0}}
          workers: {{type: int, default: 1, minimum: 1, maximum: 2}}
          seed: {{type: int, default: {index}}}
        steps:
        """) + "".join(steps)


def dagfactory_pipeline(index: int) -> str:
    tasks = []
    for name, needs in shape(index):
        task = (
            f"    {name}:\n"
            "      operator: airflow.providers.standard.operators.bash.BashOperator\n"
            f"      bash_command: echo {name}\n      retries: 1\n"
        )
        if needs:
            task += f"      dependencies: {json.dumps(needs)}\n"
        tasks.append(task)
    return (
        f"bench-{index}:\n  default_args:\n    owner: team-{index % 7}\n"
        "    start_date: 2024-01-01\n  schedule: null\n  catchup: false\n"
        "  params:\n    lr: 0.01\n    workers: 1\n"
        f"    seed: {index}\n  tasks:\n" + "".join(tasks)
    )


def parse_once(dag_file: Path, env: dict[str, str]) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(dag_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"parsing {dag_file} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def measure(dag_file: Path, env: dict[str, str], repeat: int, expected: int) -> dict[str, float]:
    runs = [parse_once(dag_file, env) for _ in range(repeat)]
    for run in runs:
        if run["dags"] != expected or run["errors"]:
            raise RuntimeError(
                f"{dag_file}: {run['dags']} DAGs, {run['errors']} import errors "
                f"(expected {expected}, 0)"
            )
    seconds = [run["seconds"] for run in runs]
    return {"median_s": statistics.median(seconds), "min_s": min(seconds)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    n = args.pipelines
    with tempfile.TemporaryDirectory(prefix="tideflow-bench-") as scratch:
        root = Path(scratch)
        env = {
            **os.environ,
            "AIRFLOW_HOME": str(root / "airflow"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DAG_FACTORY__ENABLE_TELEMETRY": "False",
            "DO_NOT_TRACK": "1",
        }
        ours, theirs = root / "tideflow-pipelines", root / "dagfactory-pipelines"
        ours.mkdir()
        theirs.mkdir()
        for index in range(n):
            (ours / f"bench-{index}.yaml").write_text(tideflow_pipeline(index))
            (theirs / f"bench-{index}.yml").write_text(dagfactory_pipeline(index))
        ours_env = {**env, "TIDEFLOW_PIPELINES_DIR": str(ours)}
        tideflow = measure(REPO / "dags" / "tideflow_pipelines.py", ours_env, args.repeat, n)
        factory_file = root / "dagfactory_dags.py"
        factory_file.write_text(
            "# airflow DAG file\nimport dagfactory\n"
            f"dagfactory.load_yaml_dags(globals_dict=globals(), dags_folder={str(theirs)!r})\n"
        )
        try:
            import dagfactory  # noqa: F401

            factory: dict[str, float] | None = measure(factory_file, env, args.repeat, n)
            factory_note = ""
        except ImportError:
            factory, factory_note = None, "dag-factory is not installed"
        except RuntimeError as exc:
            factory, factory_note = None, f"dag-factory failed: {exc}"
    result = {
        "n_pipelines": n,
        "repeat": args.repeat,
        "tideflow_parse_s": round(tideflow["median_s"], 3),
        "tideflow_parse_min_s": round(tideflow["min_s"], 3),
        "tideflow_per_pipeline_ms": round(tideflow["median_s"] / n * 1000, 2),
        "dagfactory_parse_s": round(factory["median_s"], 3) if factory else None,
        "dagfactory_per_pipeline_ms": round(factory["median_s"] / n * 1000, 2) if factory else None,
        "ratio_dagfactory_over_tideflow": round(factory["median_s"] / tideflow["median_s"], 2)
        if factory
        else None,
        "target_met": tideflow["median_s"] < TARGET_S * n / 200,
        "note": factory_note,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{n} pipelines, median of {args.repeat} fresh-process parses")
        print(
            f"  tideflow     {result['tideflow_parse_s']:.3f} s "
            f"({result['tideflow_per_pipeline_ms']} ms per pipeline)"
        )
        if factory:
            print(
                f"  dag-factory  {result['dagfactory_parse_s']:.3f} s "
                f"({result['dagfactory_per_pipeline_ms']} ms per pipeline)"
            )
            print(f"  ratio dag-factory / tideflow: {result['ratio_dagfactory_over_tideflow']}")
        else:
            print(f"  dag-factory: {factory_note}")
        print(
            f"  target (< {TARGET_S * n / 200:.1f} s): "
            f"{'met' if result['target_met'] else 'MISSED'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
