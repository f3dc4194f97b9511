"""An Argo resource step's successCondition / failureCondition, judged as Argo's executor does.

Reimplemented from argo-workflows workflow/executor/resource.go (@ f016ad8,
../shared/reference/upstream/argo/workflow-executor-resource.go): WaitResource
parses each condition as a label selector (labels.Parse), and matchConditions
reads each requirement's key as a JSON path into the object (gjsonLabels). The
step fails as soon as any one failure requirement matches; it succeeds when
every success requirement matches; otherwise it keeps polling. A step with
neither condition succeeds at once.
"""

from __future__ import annotations

from typing import Any

from tests.kubefake.selectors import parse_selector, path_value


def resource_state(obj: dict[str, Any], success: str | None, failure: str | None) -> str:
    """``"failed"``, ``"succeeded"`` or ``"waiting"`` for the object as it is now."""
    if not success and not failure:
        return "succeeded"
    lookup = lambda key: path_value(obj, key)  # noqa: E731 - a gjson lookup
    if failure and any(r.matches(lookup) for r in parse_selector(failure)):
        return "failed"
    wanted = parse_selector(success) if success else []
    if all(r.matches(lookup) for r in wanted):
        return "succeeded"
    return "waiting"
