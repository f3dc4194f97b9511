"""``EvaluationOperator``: compiles into DAGs today; execution arrives in a later release."""

from __future__ import annotations

from tideflow.operators.base import NotYetAvailableOperator


class EvaluationOperator(NotYetAvailableOperator):
    kind = "evaluation"
    template_fields = ("config",)
