"""The promotion gate as a table: thresholds, champion comparison, direction, missing data."""

from __future__ import annotations

from typing import Any

import pytest

from tideflow.promotion import decide

GATE = {
    "metric": "accuracy",
    "mode": "max",
    "min_delta": 0.01,
    "thresholds": {"accuracy": {"min": 0.9}, "loss": {"max": 0.5}},
}


@pytest.mark.parametrize(
    ("metrics", "gate", "champion", "promote", "says"),
    [
        ({"accuracy": 0.95, "loss": 0.2}, GATE, None, True, "no champion yet"),
        ({"accuracy": 0.95, "loss": 0.2}, GATE, {"accuracy": 0.93}, True, "beats the champion"),
        ({"accuracy": 0.935, "loss": 0.2}, GATE, {"accuracy": 0.93}, False, "does not beat"),
        ({"accuracy": 0.85, "loss": 0.2}, GATE, None, False, "below the threshold 0.9000"),
        ({"accuracy": 0.95, "loss": 0.9}, GATE, None, False, "loss 0.9000 is above"),
        ({"loss": 0.2}, GATE, None, False, "metric accuracy is missing"),
        (
            {"loss": 0.20},
            {"metric": "loss", "mode": "min", "min_delta": 0.05},
            {"loss": 0.30},
            True,
            "beats",
        ),
        (
            {"loss": 0.28},
            {"metric": "loss", "mode": "min", "min_delta": 0.05},
            {"loss": 0.30},
            False,
            "does not beat",
        ),
    ],
)
def test_gate(
    metrics: dict[str, float],
    gate: dict[str, Any],
    champion: dict[str, float] | None,
    promote: bool,
    says: str,
) -> None:
    decision = decide(metrics, gate, champion)
    assert decision.promote is promote
    assert says in decision.summary
