"""Text from clients, shown to the operator: never a terminal control sequence.

Client names, metadata, error messages and model output come from whoever holds (or is
asking for) a token. Printed raw, ``\\x1b[8m`` hides what follows (an ``admin`` scope
in ``lmsp pair ls``), ``\\x1b]0;…`` retitles the terminal and ``\\n`` forges table
rows. Every place the CLI prints such text goes through :func:`clean` (or
:func:`clean_json` for ``--json``), which shows each control character as a visible
escape instead: C0 and C1 controls, DEL, and the Unicode format characters that reorder
or hide text (bidirectional overrides, zero-width characters).
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

# Unicode "format" characters (Cf) are invisible and some reorder text (U+202E)
_KEEP_IN_TEXT = {"\n", "\t"}


def _visible(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _unsafe(ch: str) -> bool:
    code = ord(ch)
    if code < 0x20 or code == 0x7F or 0x80 <= code < 0xA0:
        return True
    return unicodedata.category(ch) in ("Cf", "Zl", "Zp", "Cs")


def clean(text: Any, *, multiline: bool = False) -> str:
    """``text`` with every control or format character shown as an escape (``\\x1b``,
    ``\\u202e``). ``multiline`` keeps newlines and tabs (for model output printed as
    text); in a table cell or a one-line message they are escaped too."""
    value = "" if text is None else str(text)
    if multiline:
        return "".join(_visible(c) if _unsafe(c) and c not in _KEEP_IN_TEXT else c for c in value)
    return "".join(_visible(c) if _unsafe(c) else c for c in value)


def clean_json(obj: Any, indent: int | None = 2) -> str:
    """``obj`` as JSON whose strings carry no raw control or format character (JSON
    escapes C0 itself; C1, DEL and format characters become ``\\uXXXX``)."""
    text = json.dumps(obj, indent=indent, ensure_ascii=False)
    return "".join(_json_escape(c) if _unsafe(c) and c not in "\n" else c for c in text)


def _json_escape(ch: str) -> str:
    """``ch`` as a JSON escape: ``\\uXXXX``, or its UTF-16 surrogate pair past U+FFFF
    (a tag character, U+E0020, is a format character too)."""
    code = ord(ch)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
