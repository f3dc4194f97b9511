"""What a step's entry point sees: its context, and the runner that calls it."""

from tideflow.steps.context import StepContext

__all__ = ["StepContext"]
