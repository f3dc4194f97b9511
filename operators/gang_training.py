"""``GangTrainingOperator``: compiles into DAGs today; execution arrives in a later release."""

from __future__ import annotations

from tideflow.operators.base import NotYetAvailableOperator


class GangTrainingOperator(NotYetAvailableOperator):
    kind = "gang_training"
    template_fields = ("config",)
