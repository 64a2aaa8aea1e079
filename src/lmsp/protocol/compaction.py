"""Compaction items (pure): what ``POST /v1/responses/compact`` returns in place of the
older items of a history, and how lmsp reads one back.

A ``compaction`` item carries the summary the model wrote in ``encrypted_content``, an
opaque string to the client and a versioned, keyed encoding to lmsp::

    lmspc2.<base64url of {"summary": …, "items": n}>.<HMAC-SHA256 of that, hex>

It is not encrypted (the client wrote or saw everything it summarizes). The HMAC's key
is the service's own (``compaction_key`` in the database: every node sharing it checks
alike, and it survives restarts), so an item lmsp did not write — forged, edited,
another service's, or an earlier lmsp's unkeyed ``lmspc1`` — is refused (``400`` naming
it) rather than read; so is one past the bounds lmsp writes (:data:`MAX_CONTENT`
characters, ``items`` from 1 to :data:`MAX_ITEMS`). Sent back as input, it is given to
the model as one user message that says it summarizes the conversation so far
(:func:`render_text`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Callable, Sequence
from typing import Any

from lmsp.errors import LmspError
from lmsp.protocol.fields import only_fields
from lmsp.protocol.itemtypes import Compaction, InputItem, Message

Item = dict[str, Any]

VERSION = "lmspc2"
#: the unkeyed encoding of lmsp before (refused: anyone could write one)
OLD_VERSIONS = ("lmspc1",)
KEYS = {"type", "id", "encrypted_content", "created_by"}
#: the longest ``encrypted_content`` read (a summary is at most a few hundred tokens)
MAX_CONTENT = 64 * 1024
#: the most items one compaction item may say it replaces
MAX_ITEMS = 1_000_000
#: what the model is told when it writes a summary
SUMMARY_INSTRUCTIONS = (
    "You summarize conversations. Write a short summary of the conversation below so"
    " that it can be continued without it: keep every fact, name, number, decision and"
    " open question; leave out pleasantries. Answer with the summary only."
)
#: what a compaction item reads to the model
PREAMBLE = "Summary of the conversation so far:"


def _tag(payload: str, key: bytes) -> str:
    return hmac.new(key, f"{VERSION}.{payload}".encode(), hashlib.sha256).hexdigest()


def encode(summary: str, count: int, key: bytes) -> str:
    """The ``encrypted_content`` of a summary of ``count`` items, under ``key``."""
    raw = json.dumps({"summary": summary, "items": count}, separators=(",", ":"))
    payload = base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")
    return f"{VERSION}.{payload}.{_tag(payload, key)}"


def _refused(param: str, why: str) -> LmspError:
    return LmspError("invalid_value", f"{param}: {why}", param=param)


def decode(content: Any, key: bytes, param: str = "encrypted_content") -> dict[str, Any]:
    """``{"summary", "items"}`` of an ``encrypted_content`` lmsp wrote under ``key``;
    ``400`` naming ``param`` for anything else (another service's, an earlier lmsp's,
    damaged, edited, forged, out of bounds)."""
    parts = content.split(".") if isinstance(content, str) else []
    if len(parts) == 3 and parts[0] in OLD_VERSIONS:
        raise _refused(
            param,
            "an earlier lmsp's compaction item, which carries no key and cannot be checked;"
            " compact the history again.",
        )
    if len(parts) != 3 or parts[0] != VERSION:
        raise _refused(
            param,
            "not a compaction this server made (another service's compaction items cannot"
            " be read here).",
        )
    if len(content) > MAX_CONTENT:
        raise _refused(param, f"longer than a compaction item lmsp writes ({MAX_CONTENT} chars).")
    _, payload, tag = parts
    if not hmac.compare_digest(_tag(payload, key), tag):
        raise _refused(param, "the compaction item was not made by this service, or was edited.")
    data = _payload(payload)
    if data is None:
        raise _refused(param, "the compaction item is damaged.")
    count = data.get("items")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_ITEMS:
        raise _refused(param, f"a compaction item replaces 1 to {MAX_ITEMS:,} items.")
    return data


def _payload(payload: str) -> dict[str, Any] | None:
    """The payload's ``{"summary", …}``, ``None`` if it is not JSON with a summary."""
    try:
        data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("summary"), str):
        return None
    return data


def item(summary: str, count: int, make_id: Callable[[str], str], key: bytes) -> Compaction:
    """A new compaction item."""
    # never more in practice: the items it replaces had to fit one prompt
    content = encode(summary, min(count, MAX_ITEMS), key)
    return Compaction(id=make_id("cmp"), encrypted_content=content)


def normalize(given: Item, where: str, make_id: Callable[[str], str], key: bytes | None) -> Item:
    """A ``compaction`` input item checked under ``key`` (``400`` naming the field at
    fault; without a key, where none was given, a compaction item is refused)."""
    only_fields(given, KEYS, where, "compaction item")
    content = given.get("encrypted_content")
    if key is None:
        raise LmspError(
            "unsupported_input",
            f"{where}: a compaction item is not read here.",
            param=f"{where}.type",
        )
    decode(content, key, f"{where}.encrypted_content")
    given_id = given.get("id")
    if given_id is not None and (not isinstance(given_id, str) or not given_id):
        raise LmspError(
            "invalid_value", f"{where}.id: must be a non-empty string.", param=f"{where}.id"
        )
    return {"type": "compaction", "id": given_id or make_id("cmp"), "encrypted_content": content}


def render_text(compaction: Compaction) -> str:
    """What the model reads for a compaction item (one lmsp made or checked when it came
    in: its key was checked then)."""
    parts = compaction.encrypted_content.split(".")
    data = _payload(parts[1]) if len(parts) == 3 else None
    if data is None:  # never stored so: :func:`normalize` checked it
        raise LmspError("invalid_value", "A stored compaction item is damaged.")
    return f"{PREAMBLE}\n{data['summary']}"


def split(context: Sequence[InputItem]) -> tuple[list[InputItem], list[InputItem]]:
    """``(older, kept)``: the items a compaction replaces, and the newest ones it keeps
    as they are: from the last user message on (the turn in progress), or when nothing
    comes before that, the last item only. A single item is kept: nothing to compact."""
    last_user = 0
    for index, entry in enumerate(context):
        if isinstance(entry, Message) and entry.role == "user":
            last_user = index
    if last_user == 0:
        last_user = max(len(context) - 1, 0)
    return list(context[:last_user]), list(context[last_user:])


def transcript(messages: list[dict[str, str]]) -> str:
    """Chat messages as one text for the summarizer to read."""
    return "\n\n".join(f"{m['role'].upper()}: {m['content']}" for m in messages)
