"""The promotion gate, a pure function: thresholds, then "better than the champion by delta".

A gate that names a metric the challenger was not scored on is a misconfigured
pipeline, not a rejected model: ``decide`` raises ``GateConfigError`` for it,
and the promotion fails instead of recording a non-promotion. The challenger
must beat the champion by more than ``min_delta``: a tie never promotes (with
``min_delta: 0``, only a strictly better model does), so re-running a pipeline
on an unchanged model registers no new version.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# A margin this close to min_delta is a tie: 0.96 - 0.95 is 0.010000000000000009 in binary.
_TIE_REL, _TIE_ABS = 1e-9, 1e-12


class GateConfigError(ValueError):
    """The gate names metrics the challenger was not scored on (``missing``)."""

    def __init__(self, message: str, missing: tuple[str, ...]) -> None:
        super().__init__(message)
        self.missing = missing


@dataclass(frozen=True)
class PromotionVerdict:
    """The promotion gate's verdict on a challenger: promote or not, and why."""

    promote: bool
    reasons: tuple[str, ...]
    compared: dict[str, Any] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        return "; ".join(self.reasons)


def gate_metrics(gate: Mapping[str, Any]) -> tuple[str, ...]:
    """Every metric ``gate`` reads: its ``metric``, then its ``thresholds``' keys."""
    names = [str(gate["metric"]), *(str(k) for k in (gate.get("thresholds") or {}))]
    return tuple(dict.fromkeys(names))


def check_gate(metrics: Mapping[str, float], gate: Mapping[str, Any]) -> None:
    """Raise ``GateConfigError`` naming the gate's metrics that ``metrics`` lacks."""
    missing = tuple(name for name in gate_metrics(gate) if name not in metrics)
    if missing:
        have = ", ".join(sorted(metrics)) or "none"
        raise GateConfigError(
            f"the promotion gate reads metric(s) {', '.join(missing)}, which the evaluation "
            f"did not produce (its metrics: {have}); the gate's metric and thresholds must "
            "be metrics the upstream evaluation step declares",
            missing,
        )


def _ties(margin: float, delta: float) -> bool:
    return math.isclose(margin, delta, rel_tol=_TIE_REL, abs_tol=_TIE_ABS)


def decide(
    metrics: dict[str, float], gate: dict[str, Any], champion: dict[str, float] | None
) -> PromotionVerdict:
    """``gate`` is the step's gate block; ``champion`` the current champion's metrics.

    Raises ``GateConfigError`` when ``metrics`` lacks a metric the gate reads.
    """
    check_gate(metrics, gate)
    reasons: list[str] = []
    ok = True
    compared: dict[str, Any] = {"challenger": metrics, "champion": champion}
    for name, bounds in (gate.get("thresholds") or {}).items():
        value = metrics[name]
        if not math.isfinite(value):
            ok = False
            reasons.append(f"{name} is {value}, not a finite number")
            continue
        low, high = bounds.get("min"), bounds.get("max")
        if low is not None and value < float(low):
            ok = False
            reasons.append(f"{name} {value:.4f} is below the threshold {float(low):.4f}")
        if high is not None and value > float(high):
            ok = False
            reasons.append(f"{name} {value:.4f} is above the threshold {float(high):.4f}")
    metric, mode, delta = gate["metric"], gate.get("mode", "max"), float(gate.get("min_delta", 0))
    value = metrics[metric]
    if not math.isfinite(value):
        return PromotionVerdict(
            False, (*reasons, f"{metric} is {value}, not a finite number"), compared
        )
    if champion is None or metric not in champion:
        reasons.append(f"no champion yet; {metric} {value:.4f}")
    else:
        best = champion[metric]
        margin = value - best if mode == "max" else best - value
        compared["margin"] = margin
        compared["min_delta"] = delta
        if margin > delta and not _ties(margin, delta):
            reasons.append(
                f"{metric} {value:.4f} beats the champion's {best:.4f} by "
                f"{margin:.4f} (needed more than {delta:.4f})"
            )
        else:
            ok = False
            tie = " (a tie never promotes)" if _ties(margin, delta) else ""
            reasons.append(
                f"{metric} {value:.4f} does not beat the champion's {best:.4f} by more than "
                f"{delta:.4f} (margin {margin:.4f}){tie}"
            )
    return PromotionVerdict(ok, tuple(reasons), compared)
