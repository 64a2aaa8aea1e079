"""Errors in the shape of PROTOCOL.md section 8."""

from __future__ import annotations

from typing import Any

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
    507: "server_error",
}


class LmspError(Exception):
    """An error with an HTTP status, a stable code and a human message."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.headers = headers or {}

    @property
    def type(self) -> str:
        return _TYPES.get(
            self.status, "server_error" if self.status >= 500 else "invalid_request_error"
        )

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "type": self.type,
                "code": self.code,
                "message": self.message,
                "param": self.param,
            }
        }


def invalid(message: str, param: str | None = None, code: str = "invalid_request") -> LmspError:
    return LmspError(400, code, message, param=param)


def not_found(what: str, ident: str) -> LmspError:
    return LmspError(404, "not_found", f"No {what} with id {ident!r}.")


def unauthorized(message: str = "Missing or invalid bearer token.") -> LmspError:
    return LmspError(401, "invalid_token", message, headers={"WWW-Authenticate": "Bearer"})


def forbidden(scope: str) -> LmspError:
    return LmspError(403, "insufficient_scope", f"This token lacks the scope {scope!r}.")
