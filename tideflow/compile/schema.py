"""JSON Schemas of the spec files, for editors (yaml-language-server) and CI."""

from __future__ import annotations

import json
from typing import Any

from tideflow.inventory import ClusterSpec
from tideflow.spec.models import PipelineSpec

SCHEMA_ID = "https://tideflow.dev/schemas/pipeline-v1.json"


def pipeline_schema() -> dict[str, Any]:
    schema = PipelineSpec.model_json_schema(by_alias=True)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "tideflow Pipeline (tideflow/v1)",
        **{k: v for k, v in schema.items() if k != "title"},
    }


def cluster_schema() -> dict[str, Any]:
    schema = ClusterSpec.model_json_schema(by_alias=True)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "tideflow Cluster inventory (tideflow/v1)",
        **{k: v for k, v in schema.items() if k != "title"},
    }


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
