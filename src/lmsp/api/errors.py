"""Domain error codes → HTTP statuses and the error body of PROTOCOL.md section 8.

This is the one place that knows which status a code answers with; anything not listed
is a ``400``.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from lmsp.errors import LmspError

STATUS: dict[str, int] = {
    # 401 / 403
    "invalid_token": 401,
    "insufficient_scope": 403,
    "csrf_failed": 403,
    # 404
    "not_found": 404,
    # 405
    "method_not_allowed": 405,
    # 409
    "conflict": 409,
    "model_exists": 409,
    "model_in_use": 409,
    "owner_client": 409,
    "pairing_not_pending": 409,
    "pairing_expired": 409,
    "response_in_progress": 409,
    "idempotency_request_in_progress": 409,
    "cancelled": 409,  # a chat completion whose response was cancelled
    # 413 / 415 / 422
    "request_too_large": 413,
    "unsupported_media_type": 415,
    "idempotency_key_reused": 422,
    "idempotency_key_spent": 422,
    # 429
    "queue_full": 429,
    "too_many_pairing_requests": 429,
    # 5xx
    "internal_error": 500,
    "service_unavailable": 503,
    "insufficient_storage": 507,
    # a chat completion whose response failed answers with its task's error
    "engine_error": 500,
    "engine_crashed": 500,
    "model_corrupt": 500,
    "model_load_failed": 500,
    "server_restarted": 500,
}

TYPES: dict[int, str] = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    429: "rate_limit_error",
}


def status_of(code: str) -> int:
    return STATUS.get(code, 400)


def type_of(status: int) -> str:
    if status >= 500:
        return "server_error"
    return TYPES.get(status, "invalid_request_error")


def body(exc: LmspError, status: int | None = None) -> dict[str, Any]:
    status = status_of(exc.code) if status is None else status
    return {
        "error": {
            "type": type_of(status),
            "code": exc.code,
            "message": exc.message,
            "param": exc.param,
        }
    }


def error_response(exc: LmspError) -> JSONResponse:
    status = status_of(exc.code)
    return JSONResponse(body(exc, status), status, headers=exc.headers)
