"""Run parameters reach entry points with their declared type, never guessed from text.

Through Airflow's real ``dag.test()``: a string param whose text looks like a
Python literal (``"[1, 2, 3]"``, ``"42"``) stays a string; an int param stays
an int; text around a template makes a string. Non-finite numbers are refused
with the param's name on every path that accepts params: the pipeline file,
``tideflow run --param``, and Airflow's trigger (the Param's JSON schema).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.pipelines.test_data_prep import run_dag, states, xcom
from tideflow.spec import SpecError, load_pipeline
from tideflow.spec.params import ParamValueError, parse_param_overrides

PIPELINE = """\
apiVersion: tideflow/v1
kind: Pipeline
metadata: {name: types, team: qa}
params:
  label: {type: string, default: "plain"}
  seed: {type: int, default: 7, minimum: 0}
  lr: {type: float, default: 0.1, minimum: 0.0, maximum: 1.0}
steps:
  - name: report
    data_prep:
      entrypoint: tests.step_entrypoints:report_types
      args:
        label: "{{ params.label }}"
        seed: "{{ params.seed }}"
        lr: "{{ params.lr }}"
        tagged: "run-{{ params.seed }}"
        joined: "{{ params.seed }}{{ params.seed }}"
        quoted: "42"
      outputs: [label, seed, lr, tagged, joined, quoted]
"""


def _pipeline(tmp_path: Path, text: str = PIPELINE) -> Path:
    path = tmp_path / "types.yaml"
    path.write_text(text)
    return path


@pytest.mark.processes
@pytest.mark.usefixtures("airflow_home")
def test_string_params_stay_strings_and_typed_params_keep_their_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dag_run = run_dag(_pipeline(tmp_path), monkeypatch, {"label": "[1, 2, 3]", "seed": 11})
    assert states(dag_run) == {"report": "success"}
    got = xcom(dag_run, "report")
    assert got["label"] == "str:'[1, 2, 3]'"
    assert got["seed"] == "int:11"
    assert got["lr"] == "float:0.1"
    assert got["tagged"] == "str:'run-11'"
    assert got["joined"] == "str:'1111'"
    assert got["quoted"] == "str:'42'"


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "NaN", "Infinity"])
def test_cli_params_refuse_non_finite_numbers_with_the_params_name(
    tmp_path: Path, text: str
) -> None:
    spec = load_pipeline(_pipeline(tmp_path))
    with pytest.raises(ParamValueError) as refused:
        parse_param_overrides(spec, [f"lr={text}"])
    assert str(refused.value).startswith(f"param 'lr': {text!r} is not a finite number")


@pytest.mark.parametrize("field", ["default", "minimum", "maximum"])
@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_pipeline_files_refuse_non_finite_param_numbers(
    tmp_path: Path, field: str, value: str
) -> None:
    line = f"  lr: {{type: float, {field}: {value}"
    line += ", default: 0.1}" if field != "default" else "}"
    text = PIPELINE.replace("  lr: {type: float, default: 0.1, minimum: 0.0, maximum: 1.0}", line)
    with pytest.raises(SpecError) as refused:
        load_pipeline(_pipeline(tmp_path, text))
    assert any(
        issue.field.startswith("params.lr") and "not a finite number" in issue.problem
        for issue in refused.value.issues
    ), refused.value


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_airflow_refuses_a_non_finite_param_at_trigger_time(tmp_path: Path, value: float) -> None:
    """The DAG's own Param validation (what the trigger form and REST API run) refuses it."""
    import copy

    from tideflow.compile.dag_plan import compile_dag_plan
    from tideflow.dag.builder import build_dag

    dag = build_dag(compile_dag_plan(load_pipeline(_pipeline(tmp_path))))
    params = copy.deepcopy(dag.params)  # the DAG's Params, schemas included
    params["lr"] = 0.5
    params.validate()
    with pytest.raises(Exception) as refused:
        params["lr"] = value
        params.validate()
    assert "lr" in str(refused.value)
    for finite in (0.0, 1e-300, 1.0):
        params["lr"] = finite
        params.validate()


@settings(max_examples=300, derandomize=True, database=None)
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_the_trigger_schema_refuses_exactly_the_non_finite_numbers(value: float) -> None:
    import jsonschema

    from tideflow.compile.dag_plan import compile_dag_plan

    plan = compile_dag_plan(load_pipeline(Path(__file__).parents[2] / "pipelines/digits.yaml"))
    schema = plan.params["lr"].param_kwargs()
    # the property is about finiteness, not the declared bounds
    schema = {k: v for k, v in schema.items() if k not in ("description", "minimum", "maximum")}
    valid = jsonschema.Draft202012Validator(schema).is_valid(value)
    assert valid == math.isfinite(value), (value, schema)
