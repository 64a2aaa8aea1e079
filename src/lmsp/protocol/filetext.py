"""Files as text (pure): what an ``input_file`` gives the model.

:func:`decode` and :func:`file_format` are the cheap checks every ``input_file`` gets
when a request is normalized (base64, size, a supported type). :func:`extract` turns the
file into text, once per upload (the text is stored with the item and reused by every
later turn and by the size check): plain text, Markdown, JSON and CSV are decoded as
UTF-8 (JSON must parse); a PDF's pages are read with pypdf.

pypdf's text extraction is slow on hostile files (quadratic in the text it builds; a
few kilobytes can inflate to megabytes of drawing operators), so the API runs
:func:`pdf_job` in a worker process under CPU-time and memory limits
(:mod:`lmsp.sandbox`), and the extraction stops as soon as the text passes
``max_text`` characters. Every way a file fails is an :class:`Extracted` with a refusal
(``invalid_file`` when it cannot be read), never an exception the caller must guess at;
what pypdf had to say is counted and kept short, for a debug line.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

#: the largest file an ``input_file`` may carry (decoded), and the most text it may give
MAX_FILE_BYTES = 1 << 20
MAX_FILE_TEXT = 200_000
#: text formats by file extension and by media type
TEXT_EXTENSIONS = {
    ".txt": "text",
    ".text": "text",
    ".md": "markdown",
    ".markdown": "markdown",
    ".json": "json",
    ".csv": "csv",
}
TEXT_MEDIA = {
    "text/plain": "text",
    "text/markdown": "markdown",
    "text/x-markdown": "markdown",
    "application/json": "json",
    "text/csv": "csv",
}
_DATA_URL = re.compile(r"^data:([^;,]*)((?:;[^;,]*)*),(.*)$", re.DOTALL)
#: the operators that show text, and their string operand(s)
_SHOWING = {b"Tj", b"TJ", b"'", b'"'}


class BadData(ValueError):
    """``file_data`` that is not a file: ``message`` says why (no item name)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Extracted:
    """A file's text, or why there is none: ``code`` (``invalid_file``,
    ``unsupported_input``) and ``message`` (no item name). ``warnings``: how many
    warnings the parser logged, the first of them in ``first_warning``."""

    text: str | None
    code: str = ""
    message: str = ""
    warnings: int = 0
    first_warning: str = ""


def decode(data: str) -> tuple[bytes, str | None]:
    """The bytes of ``file_data`` and the media type its ``data:`` URL names, if any
    (:class:`BadData` if it is no file, or one larger than :data:`MAX_FILE_BYTES`)."""
    media: str | None = None
    payload = data
    matched = _DATA_URL.match(data)
    if matched is not None:
        media = matched.group(1).strip().lower() or None
        if ";base64" not in matched.group(2).lower():
            raise BadData("a data: URL must be base64 encoded.")
        payload = matched.group(3)
    if len(payload) > (MAX_FILE_BYTES * 4) // 3 + 8:
        raise BadData(f"the file is larger than {MAX_FILE_BYTES} bytes.")
    try:
        raw = base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError):
        raise BadData("is not valid base64.") from None
    if len(raw) > MAX_FILE_BYTES:
        raise BadData(f"the file is larger than {MAX_FILE_BYTES} bytes.")
    return raw, media


def file_format(filename: str, media: str | None) -> str | None:
    """``text``, ``markdown``, ``json``, ``csv``, ``pdf`` or ``None`` (not supported)."""
    if media == "application/pdf":
        return "pdf"
    if media in TEXT_MEDIA:
        return TEXT_MEDIA[media]
    suffix = filename[filename.rfind(".") :].lower() if "." in filename else ""
    if suffix == ".pdf":
        return "pdf"
    return TEXT_EXTENSIONS.get(suffix)


def extract(raw: bytes, kind: str, max_text: int = MAX_FILE_TEXT) -> Extracted:
    """The text of a file of format ``kind`` (a PDF's in this process: see
    :func:`pdf_job` for the limits that belong around it)."""
    if kind == "pdf":
        return pdf_job(raw, max_text)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        return _invalid("a text file must be UTF-8.")
    if kind == "json":
        try:
            json.loads(text)
        except RecursionError:
            return _invalid("the JSON is nested too deeply.")
        except ValueError:
            return _invalid("the file is not valid JSON.")
    return _checked(text, max_text)


def _invalid(message: str) -> Extracted:
    return Extracted(None, "invalid_file", message)


def _too_much(max_text: int) -> Extracted:
    return _invalid(f"the file gives more than {max_text} characters of text.")


def _checked(text: str, max_text: int) -> Extracted:
    return _too_much(max_text) if len(text) > max_text else Extracted(text)


class _TextLimit(BaseException):
    """The text passed its limit: extraction stops (a ``BaseException``, so that
    pypdf's ``except Exception`` around a form does not swallow it)."""


class _Warnings(logging.Handler):
    """Counts what pypdf logs (and keeps the first line), instead of printing it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0
        self.first = ""

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.count += 1
            if not self.first:
                self.first = record.getMessage()[:200]


def pdf_job(raw: bytes, max_text: int = MAX_FILE_TEXT) -> Extracted:
    """A PDF's text, page after page, stopped once it passes ``max_text`` characters
    (counted as the text-showing operators' strings are met, before pypdf builds its
    text out of them). Meant for a worker process: the caller bounds CPU and memory."""
    from pypdf import PdfReader

    handler = _Warnings()
    pypdf_log = logging.getLogger("pypdf")
    pypdf_log.addHandler(handler)
    propagate, pypdf_log.propagate = pypdf_log.propagate, False
    try:
        result = _pdf_text(PdfReader, raw, max_text)
    finally:
        pypdf_log.removeHandler(handler)
        pypdf_log.propagate = propagate
    return Extracted(result.text, result.code, result.message, handler.count, handler.first)


#: what makes pypdf rebuild a PDF's cross-reference table: a ``startxref`` of 0, which
#: it takes as broken and repairs by scanning the file for its objects (non-strict)
REBUILD_XREF = b"\nstartxref\n0\n%%EOF\n"


def _open(reader_type: Any, raw: bytes) -> Any:
    """A reader of ``raw``; a PDF with no (findable) ``startxref`` — no xref table, as
    hand-made and truncated files often are — is read again with :data:`REBUILD_XREF`
    appended, so pypdf's own repair rebuilds its table (a wrong ``/Length`` it copes
    with already). The same worker, limits and budget apply to the second read."""
    try:
        return reader_type(io.BytesIO(raw))
    except (MemoryError, RecursionError):
        raise
    except Exception:
        try:
            return reader_type(io.BytesIO(raw + REBUILD_XREF))
        except (MemoryError, RecursionError):
            raise
        except Exception:
            pass
        raise


def _pdf_text(reader_type: Any, raw: bytes, max_text: int) -> Extracted:
    shown = 0

    def count(operator: bytes, operands: Any, cm: Any, tm: Any) -> None:
        nonlocal shown
        if operator in _SHOWING:
            shown += sum(_string_length(operand) for operand in operands)
            if shown > max_text:
                raise _TextLimit()

    try:
        reader = _open(reader_type, raw)
        if reader.is_encrypted:
            return Extracted(None, "unsupported_input", "encrypted PDFs are not supported.")
        pages: list[str] = []
        total = 0
        for page in reader.pages:
            text = (page.extract_text(visitor_operand_before=count) or "").strip()
            pages.append(text)
            total += len(text) + 2
            if total > max_text + 2:
                raise _TextLimit()
    except _TextLimit:
        return _too_much(max_text)
    except MemoryError:
        raise  # the worker answers it as a memory limit
    except RecursionError:
        return _invalid("the PDF cannot be read (its objects are nested too deeply).")
    except Exception:  # pypdf raises many kinds on damaged files; all mean the same
        return _invalid("the PDF cannot be read (it is damaged or not a PDF).")
    text = "\n\n".join(pages).strip()
    if not text:
        return Extracted(
            None, "unsupported_input", "the PDF has no extractable text (a scan needs OCR first)."
        )
    return _checked(text, max_text)


def _string_length(operand: Any) -> int:
    """The characters a text-showing operand may give (its strings' lengths)."""
    if isinstance(operand, (str, bytes)):
        return len(operand)
    if isinstance(operand, list):
        return sum(_string_length(inner) for inner in operand)
    return 0
