"""Log lines: human-readable by default, one JSON object a line with
``LMSP_LOG_FORMAT=json``.

A JSON line has ``time`` (RFC 3339, UTC, milliseconds), ``level``, ``logger``, ``event``
(a stable name: the ``event`` given with the line, else its message template),
``message`` (the rendered text), and, when known, ``task_id``, ``response_id``,
``client_id`` and ``request_id``. The request's id and client are taken from the
context the line was written in (:data:`request_id`, :data:`client_id`); the others are
passed with ``extra=``.

What lmsp logs at ``INFO`` names objects by id and counts things; it never writes a
token, a prompt or an output text (``tests/test_logs.py`` checks a whole run).
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import Any

FORMATS = ("text", "json")
#: the fields a line may carry, in the order a JSON line shows them (``code`` and
#: ``param``: a refused request's error, on every line written after its answer was
#: made — uvicorn's access line of a ``4xx``/``5xx`` too)
CONTEXT_FIELDS = ("task_id", "response_id", "client_id", "request_id", "code", "param")

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "lmsp_request_id", default=None
)
client_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "lmsp_client_id", default=None
)

#: the request's refusal (``code``, ``param``), once its error answer is made: a holder
#: set for each request (:func:`refusal_holder`), filled by :func:`note_refusal`
refusal: contextvars.ContextVar[dict[str, str | None] | None] = contextvars.ContextVar(
    "lmsp_refusal", default=None
)


def note_refusal(code: str, param: str | None) -> None:
    """The request being answered is refused with ``code`` (at ``param``)."""
    holder = refusal.get()
    if holder is not None:
        holder["code"], holder["param"] = code, param
        holder["client_id"] = client_id.get()


_RESERVED = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class _Context(logging.Filter):
    """Attach the request's id and client to every record written in its context."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = request_id.get()
        if getattr(record, "client_id", None) is None:
            record.client_id = client_id.get()
        refused = refusal.get()
        if refused and getattr(record, "code", None) is None:
            record.code, record.param = refused.get("code"), refused.get("param")
        return True


class _Demote(logging.Filter):
    """What a file parser logs about a client's file (pypdf warns once per damaged
    object: tens of thousands of lines for one hostile PDF) is debug detail: shown at
    ``DEBUG`` only, whatever level it was logged at."""

    PREFIXES = ("pypdf",)

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith(self.PREFIXES) and record.levelno < logging.CRITICAL:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return self.level <= logging.DEBUG
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line: dict[str, Any] = {
            "time": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": getattr(record, "event", None) or str(record.msg),
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            found = getattr(record, name, None)
            if found is not None:
                line[name] = found
        for name, found in record.__dict__.items():  # other ``extra=`` fields
            plain = isinstance(found, str | int | float | bool) or found is None
            if plain and name not in _RESERVED and name not in line and name != "event":
                line[name] = found
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """``time level logger: message`` plus the ids the line carries, as ``key=value``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        ids = [
            f"{name}={found}"
            for name in CONTEXT_FIELDS
            if (found := getattr(record, name, None)) is not None and str(found) not in text
        ]
        if not ids:
            return text
        head, newline, rest = text.partition("\n")  # after the message, before a traceback
        return f"{head} [{' '.join(ids)}]{newline}{rest}"


def configure(fmt: str = "text", level: int = logging.INFO) -> logging.Handler:
    """Send lmsp's, uvicorn's and llama.cpp's Python logs to stderr in ``fmt``."""
    if fmt not in FORMATS:
        raise ValueError(f"LMSP_LOG_FORMAT must be one of {', '.join(FORMATS)}, not {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_Demote(level))
    handler.addFilter(_Context())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        uv = logging.getLogger(name)
        uv.handlers.clear()
        uv.propagate = True
    return handler
