"""The run's priority class: one param, accepted wherever a run's params are.

A pipeline that names ``metadata.priority_class`` gets a ``priority_class`` param
(its default that class): the DAG has it (``tideflow plan --json``), and so
``tideflow run --param priority_class=...`` must accept it too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tideflow.compile.dag_plan import compile_dag_plan
from tideflow.spec import PipelineSpec, load_pipeline
from tideflow.spec.params import ParamValueError, parse_param_overrides

PIPELINE = """\
apiVersion: tideflow/v1
kind: Pipeline
metadata: {{name: vision-train, team: vision{named}}}
params:
  seed: {{type: int, default: 7}}
steps:
  - name: train
    gang_training:
      entrypoint: [python, -m, vision.train]
      workers: 1
"""


def spec_of(tmp_path: Path, priority_class: str | None) -> PipelineSpec:
    named = f", priority_class: {priority_class}" if priority_class else ""
    path = tmp_path / "p.yaml"
    path.write_text(PIPELINE.format(named=named))
    return load_pipeline(path)


def test_a_run_may_choose_its_priority_class(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, "batch")
    assert "priority_class" in compile_dag_plan(spec).params
    chosen = parse_param_overrides(spec, ["priority_class=normal", "seed=3"])
    assert chosen == {"priority_class": "normal", "seed": 3}


def test_the_cli_accepts_exactly_the_dags_params(tmp_path: Path) -> None:
    for named in ("batch", None):
        spec = spec_of(tmp_path, named)
        for name, param in compile_dag_plan(spec).params.items():
            value = str(param.default)
            assert name in parse_param_overrides(spec, [f"{name}={value}"])


def test_without_a_priority_class_there_is_no_such_param(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, None)
    with pytest.raises(ParamValueError, match="unknown param 'priority_class'"):
        parse_param_overrides(spec, ["priority_class=normal"])
