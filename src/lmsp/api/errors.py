"""Domain error codes → HTTP statuses and the error bodies: PROTOCOL.md section 8's,
and Anthropic's envelope on the Messages routes.

This is the one place that knows which status a code answers with; anything not listed
is a ``400``. Which body an error gets depends on the path alone (:func:`is_messages`), so
a refusal made before routing (a body too large, a bad token) has the right shape too.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from lmsp import logs
from lmsp.errors import LmspError

STATUS: dict[str, int] = {
    # 401 / 403
    "invalid_token": 401,
    "insufficient_scope": 403,
    "cross_site_request": 403,  # a browser's cross-site request to a route with no token
    # 404
    "not_found": 404,
    # 405
    "method_not_allowed": 405,
    # 421: a Host name the service does not answer for (lmsp.api.hosts)
    "misdirected_request": 421,
    # 409
    "conflict": 409,
    "model_exists": 409,
    "model_in_use": 409,
    "owner_client": 409,
    "pairing_not_pending": 409,
    "pairing_expired": 409,
    "response_in_progress": 409,
    "history_deleted": 409,  # a conversation whose history lost a response
    "conversation_quota_exceeded": 409,  # items past a conversation's quotas
    "idempotency_request_in_progress": 409,
    "cancelled": 409,  # a chat completion whose response was cancelled
    # 413 / 415 / 422
    "request_too_large": 413,
    "unsupported_media_type": 415,
    "request_header_too_large": 431,
    "idempotency_key_reused": 422,
    "idempotency_key_spent": 422,
    # 429
    "queue_full": 429,
    "too_many_pairing_requests": 429,
    "rate_limit_exceeded": 429,  # over a client's limit (PROTOCOL.md 13)
    "too_many_websockets": 429,  # a client's open WebSockets (LMSP_WS_PER_CLIENT)
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
    # the model hub a pull reads (PROTOCOL.md section 12) is down or answers oddly
    "hub_unavailable": 503,
    "hub_error": 503,
    # an unknown model: 404 on every route, as OpenAI and Anthropic answer it
    "model_not_found": 404,
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
    logs.note_refusal(exc.code, exc.param)  # the request's log lines name its error
    return {
        "error": {
            "type": type_of(status),
            "code": exc.code,
            "message": exc.message,
            "param": exc.param,
        }
    }


# -- the Anthropic envelope (the Messages routes) ---------------------------------------------
MESSAGES_PATH = "/v1/messages"
#: codes whose status differs on the Messages routes (Anthropic answers an unknown model 404)
ANTHROPIC_STATUS: dict[str, int] = {"model_not_found": 404}
ANTHROPIC_TYPES: dict[int, str] = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
#: codes an Anthropic SDK must not retry although their status says it may (a cancelled
#: message stays cancelled; retrying a still-running idempotent request only waits)
NO_RETRY = frozenset({"cancelled"})


def is_messages(path: str) -> bool:
    """Does ``path`` belong to the Messages API (errors in Anthropic's envelope)?"""
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


def anthropic_status(code: str) -> int:
    return ANTHROPIC_STATUS.get(code, status_of(code))


def anthropic_type(status: int) -> str:
    """Anthropic's error type for a status: ``api_error`` for a 5xx it has no name for,
    ``invalid_request_error`` for any other 4xx (as its documentation says)."""
    if status in ANTHROPIC_TYPES:
        return ANTHROPIC_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def anthropic_body(kind: str, message: str) -> dict[str, Any]:
    """``{"type": "error", "error": {"type", "message"}, "request_id"}``."""
    return {
        "type": "error",
        "error": {"type": kind, "message": message},
        "request_id": logs.request_id.get(),
    }


def anthropic_response(exc: LmspError, status: int | None = None) -> JSONResponse:
    """The envelope has no ``param``: the message names the field at fault instead."""
    status = anthropic_status(exc.code) if status is None else status
    logs.note_refusal(exc.code, exc.param)
    headers = dict(exc.headers)
    if exc.code in NO_RETRY:
        headers["x-should-retry"] = "false"
    message = exc.message
    if exc.param is not None and not message.startswith(exc.param):
        message = f"{exc.param}: {message}"
    return JSONResponse(anthropic_body(anthropic_type(status), message), status, headers)


def error_response(exc: LmspError, path: str = "") -> JSONResponse:
    """The answer to ``exc`` on ``path``: Anthropic's envelope on the Messages routes,
    section 8's body elsewhere."""
    if is_messages(path):
        return anthropic_response(exc)
    status = status_of(exc.code)
    return JSONResponse(body(exc, status), status, headers=exc.headers)
