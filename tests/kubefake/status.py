"""API errors as the API server writes them: a ``Status`` body and its HTTP code.

Shapes follow k8s.io/apimachinery pkg/api/errors (NewNotFound, NewAlreadyExists,
NewConflict, NewForbidden, NewInvalid, NewTooManyRequests, NewResourceExpired,
NewBadRequest) and the admission webhook wrapping of k8s.io/apiserver
pkg/admission/plugin/webhook/errors ToStatusErr (a webhook's denial keeps the
code the webhook gave, at least 400, and its message is prefixed with
``admission webhook "<name>" denied the request: ``). Reimplemented from the
documented behaviour, not copied.
"""

from __future__ import annotations

from typing import Any

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
}


class ApiError(Exception):
    """A request the fake refuses; ``body`` is the Status the client receives."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = REASONS.get(code, "") if reason is None else reason
        self.details = details or {}

    @property
    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def success(code: int = 200, **details: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def _what(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def not_found(resource: str, group: str, name: str) -> ApiError:
    return ApiError(
        404,
        f'{_what(resource, group)} "{name}" not found',
        details={"name": name, "group": group, "kind": resource},
    )


def already_exists(resource: str, group: str, name: str) -> ApiError:
    return ApiError(
        409,
        f'{_what(resource, group)} "{name}" already exists',
        reason="AlreadyExists",
        details={"name": name, "group": group, "kind": resource},
    )


def conflict(resource: str, group: str, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {_what(resource, group)} "{name}": {why}',
        details={"name": name, "group": group, "kind": resource},
    )


def invalid(kind: str, group: str, name: str, causes: list[str]) -> ApiError:
    """422 Invalid: ``<Kind>.<group> "<name>" is invalid: <cause>[, <cause>...]``."""
    what = f"{kind}.{group}" if group else kind
    joined = causes[0] if len(causes) == 1 else "[" + ", ".join(causes) + "]"
    return ApiError(
        422,
        f'{what} "{name}" is invalid: {joined}',
        details={
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [{"reason": "FieldValueInvalid", "message": c} for c in causes],
        },
    )


def webhook_denied(webhook: str, code: int, message: str, reason: str | None = None) -> ApiError:
    """A validating or mutating webhook's refusal, as the API server reports it."""
    code = max(code, 400)
    return ApiError(
        code,
        f'admission webhook "{webhook}" denied the request: {message}',
        reason=reason if reason is not None else ("" if code == 400 else None),
    )


def expired(requested: int, oldest: int) -> ApiError:
    return ApiError(410, f"too old resource version: {requested} ({oldest})", reason="Expired")
