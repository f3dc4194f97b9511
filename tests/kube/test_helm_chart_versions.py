"""The Airflow Helm values against the chart versions the deploy guide names.

The official chart validates values with its ``values.schema.json``
(``additionalProperties: false`` throughout), so a key a chart version does
not know makes ``helm install`` fail. The schemas of chart 1.18.0 and of the
newest chart (main) are read from ../shared/schemas/airflow-chart; these
tests skip without it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHARTS = REPO.parent / "shared" / "schemas" / "airflow-chart"
VALUES = REPO / "deploy" / "helm" / "airflow-values.yaml"
GUIDE = REPO / "docs" / "how-to" / "deploy-kubernetes.md"

pytestmark = pytest.mark.skipif(
    not CHARTS.is_dir(), reason="needs ../shared/schemas/airflow-chart (the chart schemas)"
)


def problems(values: dict[str, Any], chart: str) -> list[str]:
    schema = json.loads((CHARTS / chart / "values.schema.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    return sorted(
        f"{'.'.join(str(p) for p in error.path)}: {error.message}"
        for error in validator.iter_errors(values)
    )


def values() -> dict[str, Any]:
    return dict(yaml.safe_load(VALUES.read_text()))


def test_the_values_install_on_the_newest_chart() -> None:
    assert problems(values(), "main") == []


def test_chart_1_18_refuses_the_values_only_for_create_user_job_enabled() -> None:
    """1.18 has no createUserJob.enabled (it came in 1.19): the guide must not name 1.18."""
    assert problems(values(), "1.18.0") == [
        "createUserJob: Additional properties are not allowed ('enabled' was unexpected)"
    ]
    without = values()
    del without["createUserJob"]["enabled"]
    assert problems(without, "1.18.0") == []  # everything else is as old as 1.18


def test_the_guide_states_the_minimum_chart_the_values_install_on() -> None:
    guide = GUIDE.read_text()
    assert not re.search(r"chart 1\.18 or later", guide)
    assert "Use chart 1.19 or later" in guide
