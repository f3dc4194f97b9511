"""``PromoteCheckpointOperator``: compiles into DAGs today; execution arrives in a later release."""

from __future__ import annotations

from tideflow.operators.base import NotYetAvailableOperator


class PromoteCheckpointOperator(NotYetAvailableOperator):
    kind = "promote_checkpoint"
    template_fields = ("config",)
