"""A ValidatingAdmissionPolicy's CEL, evaluated offline with cel-python (``celpy``).

No API server runs here. Kubernetes evaluates a policy with cel-go against typed
objects; cel-python implements the same language (the CEL specification), so a
policy written in the common part of both (``has()``, ``in``, ``all``,
``filter``, ``size``, comparisons) means the same in each. What this helper
does follows the Kubernetes documentation of ValidatingAdmissionPolicy
(https://kubernetes.io/docs/reference/access-authn-authz/validating-admission-policy/):

* the policy applies only when every ``matchConditions`` expression is true;
* ``variables`` are evaluated in order, each seeing the earlier ones as
  ``variables.NAME``;
* a request is admitted when every ``validations`` expression is true; one that
  is false, or fails to evaluate (``failurePolicy: Fail``), denies it with its
  message.
"""

from __future__ import annotations

from typing import Any


def _evaluate(expression: str, activation: dict[str, Any]) -> Any:
    import celpy

    env = celpy.Environment()
    program = env.program(env.compile(expression))
    try:
        return program.evaluate(activation)
    except celpy.CELEvalError as exc:
        return exc


def _true(value: Any) -> bool:
    from celpy import celtypes

    return isinstance(value, celtypes.BoolType) and bool(value)


def evaluate(
    policy: dict[str, Any], *, old: dict[str, Any], new: dict[str, Any], username: str
) -> list[str] | None:
    """None when the policy does not apply to the request; else the messages that deny it."""
    import celpy
    from celpy import celtypes

    spec = policy["spec"]
    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(new),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel(
            {"operation": "UPDATE", "userInfo": {"username": username}, "kind": {"kind": "Node"}}
        ),
    }
    for condition in spec.get("matchConditions", []):
        if not _true(_evaluate(condition["expression"], activation)):
            return None
    variables = celtypes.MapType({})
    for variable in spec.get("variables", []):
        activation["variables"] = variables
        value = _evaluate(variable["expression"], activation)
        variables = celtypes.MapType({**variables, celtypes.StringType(variable["name"]): value})
    activation["variables"] = variables
    return [
        str(validation.get("message", validation["expression"]))
        for validation in spec["validations"]
        if not _true(_evaluate(validation["expression"], activation))
    ]
