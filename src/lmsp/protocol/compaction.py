"""Compaction items (pure): what ``POST /v1/responses/compact`` returns in place of the
older items of a history, and how lmsp reads one back.

A ``compaction`` item carries the summary the model wrote in ``encrypted_content``, an
opaque string to the client and a versioned, integrity-checked encoding to lmsp::

    lmspc1.<base64url of {"summary": …, "items": n}>.<sha256 of that, first 32 hex>

It is not encrypted (the client wrote or saw everything it summarizes); the check
catches a damaged or edited item, which is refused (``400`` naming it) rather than
read wrongly. Sent back as input, it is given to the model as one user message that
says it summarizes the conversation so far (:func:`render_text`).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from typing import Any

from lmsp.errors import LmspError

Item = dict[str, Any]

VERSION = "lmspc1"
KEYS = {"type", "id", "encrypted_content", "created_by"}
#: what the model is told when it writes a summary
SUMMARY_INSTRUCTIONS = (
    "You summarize conversations. Write a short summary of the conversation below so"
    " that it can be continued without it: keep every fact, name, number, decision and"
    " open question; leave out pleasantries. Answer with the summary only."
)
#: how a compaction item reads to the model
PREAMBLE = "Summary of the conversation so far:"


def _digest(payload: str) -> str:
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def encode(summary: str, count: int) -> str:
    """The ``encrypted_content`` of a summary of ``count`` items."""
    raw = json.dumps({"summary": summary, "items": count}, separators=(",", ":"))
    payload = base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")
    return f"{VERSION}.{payload}.{_digest(payload)}"


def decode(content: Any, param: str = "encrypted_content") -> dict[str, Any]:
    """``{"summary", "items"}`` of an ``encrypted_content`` lmsp wrote; ``400`` naming
    ``param`` for anything else (another service's, damaged, edited)."""
    parts = content.split(".") if isinstance(content, str) else []
    if len(parts) != 3 or parts[0] != VERSION:
        raise LmspError(
            "invalid_value",
            f"{param}: not a compaction this server made (another service's compaction"
            " items cannot be read here).",
            param=param,
        )
    _, payload, digest = parts
    if _digest(payload) != digest:
        raise LmspError(
            "invalid_value", f"{param}: the compaction item is damaged or edited.", param=param
        )
    try:
        data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except ValueError:
        raise LmspError(
            "invalid_value", f"{param}: the compaction item is damaged.", param=param
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("summary"), str):
        raise LmspError("invalid_value", f"{param}: the compaction item is damaged.", param=param)
    return data


def item(summary: str, count: int, make_id: Callable[[str], str]) -> Item:
    """A new compaction item."""
    return {"type": "compaction", "id": make_id("cmp"), "encrypted_content": encode(summary, count)}


def normalize(given: Item, where: str, make_id: Callable[[str], str]) -> Item:
    """A ``compaction`` input item checked (``400`` naming the field at fault)."""
    for key in given:
        if key not in KEYS:
            raise LmspError(
                "unsupported_parameter",
                f"{where}.{key}: a compaction item has no field {key!r} here.",
                param=f"{where}.{key}",
            )
    content = given.get("encrypted_content")
    decode(content, f"{where}.encrypted_content")
    given_id = given.get("id")
    if given_id is not None and (not isinstance(given_id, str) or not given_id):
        raise LmspError(
            "invalid_value", f"{where}.id: must be a non-empty string.", param=f"{where}.id"
        )
    return {"type": "compaction", "id": given_id or make_id("cmp"), "encrypted_content": content}


def render_text(compaction: Item) -> str:
    """What the model reads for a compaction item."""
    return f"{PREAMBLE}\n{decode(compaction['encrypted_content'])['summary']}"


def split(context: list[Item]) -> tuple[list[Item], list[Item]]:
    """``(older, kept)``: the items a compaction replaces, and the newest ones it keeps
    as they are: from the last user message on (the turn in progress), or when nothing
    comes before that, the last item only. A single item is kept: nothing to compact."""
    last_user = 0
    for index, entry in enumerate(context):
        if entry.get("type") == "message" and entry.get("role") == "user":
            last_user = index
    if last_user == 0:
        last_user = max(len(context) - 1, 0)
    return list(context[:last_user]), list(context[last_user:])


def transcript(messages: list[dict[str, str]]) -> str:
    """Chat messages as one text for the summarizer to read."""
    return "\n\n".join(f"{m['role'].upper()}: {m['content']}" for m in messages)
