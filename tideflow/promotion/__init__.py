"""Champion/challenger promotion: the gate (pure) and the registry moves (MLflow)."""

from tideflow.promotion.gate import GateConfigError, PromotionVerdict, decide

__all__ = ["GateConfigError", "PromotionVerdict", "decide"]
