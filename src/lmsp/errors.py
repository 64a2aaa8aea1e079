"""Domain errors: a stable code, a human message and the request field at fault.

Nothing below the API knows HTTP: the store, the runner and the engines raise
:class:`LmspError` with a code, and :mod:`lmsp.api.errors` maps each code to its status
and renders the section-8 body.
"""

from __future__ import annotations


class LmspError(Exception):
    """A refusal or failure with a stable ``code`` (``queue_full``, ``not_found`` …)."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.headers = headers or {}


def invalid(message: str, param: str | None = None, code: str = "invalid_request") -> LmspError:
    return LmspError(code, message, param=param)


def unsupported(param: str, message: str) -> LmspError:
    """``400 unsupported_parameter``: a well-formed value lmsp cannot honour (PROTOCOL.md
    section 4: refused, never silently ignored)."""
    return LmspError("unsupported_parameter", message, param=param)


def not_found(what: str, ident: str, param: str | None = None) -> LmspError:
    return LmspError("not_found", f"No {what} with id {ident!r}.", param=param)


def unauthorized(message: str = "Missing or invalid bearer token.") -> LmspError:
    return LmspError("invalid_token", message, headers={"WWW-Authenticate": "Bearer"})


def forbidden(scope: str) -> LmspError:
    return LmspError("insufficient_scope", f"This token lacks the scope {scope!r}.")


#: what marks a text as a library's internals rather than a message for a client
_INTERNALS = ("Traceback", "panicked", "panic:", "backtrace", ".rs:", 'File "', "site-packages")


def client_message(text: str, fallback: str = "The engine failed.") -> str:
    """``text`` as a client may read it: its first line, at most 500 characters, or
    ``fallback`` when it shows a library's internals (a panic, a backtrace, source
    paths). The caller logs the original."""
    if any(marker in text for marker in _INTERNALS):
        return fallback
    first = text.strip().splitlines()[0] if text.strip() else fallback
    return first if len(first) <= 500 else first[:497] + "..."
