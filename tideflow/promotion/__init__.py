"""Champion/challenger promotion: the gate (pure) and the registry moves (MLflow)."""

from tideflow.promotion.gate import Decision, GateConfigError, decide

__all__ = ["Decision", "GateConfigError", "decide"]
