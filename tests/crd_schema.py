"""Moved to tests/kubefake/schemas.py (the one Kubernetes fake's validation); these names
are kept for tests/test_argo_compile.py until it imports them from there."""

from tests.kubefake.schemas import SCHEMAS, crd_schema, unknown_fields, validate

__all__ = ["SCHEMAS", "crd_schema", "unknown_fields", "validate"]
