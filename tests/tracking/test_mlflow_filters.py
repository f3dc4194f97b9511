"""Values inside MLflow search filters: quoted so that MLflow's own parser reads them back.

MLflow strips the quotes around a string value and unescapes nothing, so a
value is wrapped in the quote it does not contain; a value that holds both
quotes, or ends in a backslash (which the tokenizer takes as escaping the
closing quote), cannot be written at all and is refused. The round trips go
through MLflow's parser; the lookups run against a real MLflow store
(SQLite, set up by conftest).
"""

from __future__ import annotations

import uuid

import pytest

SAFE = (
    "plain",
    "it's-a-model",
    'say "hi"',
    "a\\b",
    "x\\'",
    "a''b",
    "'",
    '"',
    "tab\tand space",
    "%_*",
    "a`b",
    "-- not a comment",
    "manual__2026-11-23T05:38:10+00:00",
    "ünïcødé",
)


@pytest.mark.parametrize("value", SAFE)
def test_filter_literal_round_trips_through_mlflows_parser(value: str) -> None:
    from mlflow.utils.search_utils import SearchModelVersionUtils, SearchUtils

    from tideflow.tracking.runs import filter_literal

    versions = SearchModelVersionUtils.parse_search_filter(
        f"name = {filter_literal(value)} and run_id = {filter_literal('r1')}"
    )
    assert [c["value"] for c in versions] == [value, "r1"]
    runs = SearchUtils.parse_search_filter(
        f"tags.`a` = {filter_literal(value)} and tags.`b` = {filter_literal(value)}"
    )
    assert [c["value"] for c in runs] == [value, value]


@pytest.mark.parametrize("value", ["both ' and \"", "ends in a backslash\\"])
def test_filter_literal_refuses_what_a_filter_cannot_hold(value: str) -> None:
    from tideflow.tracking.runs import filter_literal

    with pytest.raises(ValueError, match="MLflow search filter"):
        filter_literal(value)


def test_runs_of_a_dag_run_whose_id_holds_a_quote_are_found_again() -> None:
    from tideflow.tracking.runs import ensure_runs, finish_pipeline_run

    pipeline = f"quote-{uuid.uuid4().hex[:8]}"
    first = ensure_runs(
        pipeline=pipeline, team="t", dag_id=pipeline, dag_run_id="it's", step="s", kind="data_prep"
    )
    again = ensure_runs(
        pipeline=pipeline, team="t", dag_id=pipeline, dag_run_id="it's", step="s", kind="data_prep"
    )
    assert again == first
    assert finish_pipeline_run(
        pipeline=pipeline, dag_id=pipeline, dag_run_id="it's", succeeded=True
    )


def test_a_version_of_a_model_named_with_a_quote_is_found_by_its_run() -> None:
    from tideflow.promotion.registry import client, version_for_run

    mlflow = client()
    name = f"it's-a-model-{uuid.uuid4().hex[:8]}"
    run = mlflow.create_run(mlflow.create_experiment(f"registry-{uuid.uuid4().hex[:8]}"))
    mlflow.create_registered_model(name)
    mlflow.create_model_version(name, source="file:///tmp/model", run_id=run.info.run_id)
    found = version_for_run(mlflow, name, run.info.run_id)
    assert found is not None and str(found.version) == "1"
