"""The promotion gate, a pure function: thresholds, then "better than the champion by delta"."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Decision:
    promote: bool
    reasons: tuple[str, ...]
    compared: dict[str, Any] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        return "; ".join(self.reasons)


def decide(
    metrics: dict[str, float], gate: dict[str, Any], champion: dict[str, float] | None
) -> Decision:
    """``gate`` is the step's gate block; ``champion`` the current champion's metrics."""
    reasons: list[str] = []
    ok = True
    compared: dict[str, Any] = {"challenger": metrics, "champion": champion}
    for name, bounds in (gate.get("thresholds") or {}).items():
        value = metrics.get(name)
        if value is None:
            ok = False
            reasons.append(f"metric {name} is missing")
            continue
        low, high = bounds.get("min"), bounds.get("max")
        if low is not None and value < float(low):
            ok = False
            reasons.append(f"{name} {value:.4f} is below the threshold {float(low):.4f}")
        if high is not None and value > float(high):
            ok = False
            reasons.append(f"{name} {value:.4f} is above the threshold {float(high):.4f}")
    metric, mode, delta = gate["metric"], gate.get("mode", "max"), float(gate.get("min_delta", 0))
    value = metrics.get(metric)
    if value is None:
        return Decision(False, (*reasons, f"gate metric {metric} is missing"), compared)
    if champion is None or metric not in champion:
        reasons.append(f"no champion yet; {metric} {value:.4f}")
    else:
        best = champion[metric]
        margin = value - best if mode == "max" else best - value
        compared["margin"] = margin
        if margin >= delta:
            reasons.append(
                f"{metric} {value:.4f} beats the champion's {best:.4f} by "
                f"{margin:.4f} (needed {delta:.4f})"
            )
        else:
            ok = False
            reasons.append(
                f"{metric} {value:.4f} does not beat the champion's {best:.4f} by "
                f"{delta:.4f} (margin {margin:.4f})"
            )
    return Decision(ok, tuple(reasons), compared)
