"""The create request, typed (pure): what every API's create body becomes, and the
:class:`PreparedRequest` the store keeps and the runner reads, frozen.

A create is parsed once, at its API's boundary (``/v1/responses``, and the Chat
Completions, Completions and Messages translators), into a :class:`CreateRequest`: its
tools and ``tool_choice`` read and checked (:mod:`lmsp.protocol.tools`), its text
format, its sampling numbers, and its input as given (or, from a translator, already
checked into items). The create use case prepares it once (the model an alias names, the
sampling numbers it runs with, its input checked into :mod:`~lmsp.protocol.itemtypes`
with each file's text, its conversation's place, what ``truncation: "auto"`` left out)
into a :class:`PreparedRequest`, which is stored (:func:`dumps`) and read back as the
same type (:func:`loads`); no layer edits one another reads (each step derives a new one,
:func:`msgspec.structs.replace`).

The stored JSON is the shape lmsp always kept: the request's fields as given (``None``
left out) and lmsp's own keys (``lmsp_history``, ``lmsp_truncated``, …), so a row written
by an earlier version reads as it is; the few shapes that were stored before input
items were normalized are read by :func:`loads` too (:func:`_legacy`).
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec
from msgspec import Struct, field

from lmsp.protocol import items
from lmsp.protocol.itemtypes import Items, typed
from lmsp.protocol.tools import Tool, ToolChoice

#: the stored key of the history a row of an earlier version holds inline
HISTORY = "lmsp_history"
#: what a request that does not name them gets (and the response echoes)
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0
#: every sampling number the response object echoes, with lmsp's defaults
SAMPLING_DEFAULTS: dict[str, float | int] = {
    "temperature": DEFAULT_TEMPERATURE,
    "top_p": DEFAULT_TOP_P,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "top_logprobs": 0,
    # LMSP extensions (llama.cpp's samplers), off by default
    "top_k": 0,
    "min_p": 0.0,
    "repeat_penalty": 1.0,
}
#: the sampling numbers a model may carry defaults for (``top_logprobs`` is the caller's)
MODEL_DEFAULTS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
)


class Shape(Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A JSON object of the request (unset fields are not stored)."""


class TextFormat(Shape, frozen=True):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class TextConfig(Shape, frozen=True):
    format: TextFormat | None = None
    verbosity: str | None = None


class Reasoning(Shape, frozen=True):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class StreamOptions(Shape, frozen=True):
    include_obfuscation: bool | None = None


class ConversationRef(Shape, frozen=True):
    """The conversation a turn joins (``{"id"}``, as the response object shows it)."""

    id: str


class Brief(Struct, frozen=True):
    """An item named in a record: its id, type and role (each may be ``null``)."""

    id: str | None
    type: str | None
    role: str | None


class Truncated(Shape, frozen=True):
    """What ``truncation: "auto"`` left out of the context, decided when the request was
    created: the ``items`` oldest ones, the first and the last of them, and how many it
    ``kept`` (internal: all a runner reads). Rows from before ``kept`` name only the
    count, and rows from before that the whole ``dropped`` list."""

    items: int
    first: Brief | None = None
    last: Brief | None = None
    kept: int | None = None
    dropped: tuple[Brief, ...] | None = None


class Compacted(Shape, frozen=True):
    """What ``context_management`` compacted before the request ran."""

    items: int
    input_tokens: int
    threshold: int


class RequestFields(Shape, frozen=True):
    """The fields a create request and its prepared form share."""

    model: str
    instructions: str | None = None
    previous_response_id: str | None = None
    include: tuple[str, ...] | None = None
    tools: tuple[Tool, ...] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = None
    # sampling (fixed when it is prepared: :func:`sampling_used`)
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    top_logprobs: int | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] | None = None
    # how it is asked and kept
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    background: bool | None = None
    store: bool | None = None
    on_restart: str | None = None
    service_tier: str | None = None
    truncation: str | None = None
    metadata: dict[str, str] | None = None
    reasoning: Reasoning | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    user: str | None = None
    conversation: ConversationRef | None = None
    #: a text completion: its one input item is a raw prompt (:mod:`.completions`)
    raw_prompt: bool | None = field(default=None, name="lmsp_raw_prompt")


#: the names of the shared fields (a create's, carried into its prepared form)
SHARED = RequestFields.__struct_fields__


class CreateRequest(RequestFields, frozen=True, kw_only=True):
    """A create as its API's boundary parsed it (never stored): its input as given, for
    the create to check (``given``), or the items a translator checked already
    (``input``); the MCP tools' header values, kept apart from what is stored."""

    given: str | list[Any] | None = None
    input: Items = ()
    mcp_headers: dict[str, dict[str, str]] = field(default_factory=dict)


class PreparedRequest(RequestFields, frozen=True, kw_only=True):
    """A create ready to run: its checked input items, and what lmsp decided when it was
    created. What the store keeps (:func:`dumps`), what the runner reads back
    (:func:`loads`, with ``history`` attached by the store)."""

    input: Items
    #: the ``seq`` of the last conversation item its context holds
    conversation_upto: int | None = field(default=None, name="lmsp_conversation_upto")
    truncated: Truncated | None = field(default=None, name="lmsp_truncated")
    compacted: Compacted | None = field(default=None, name="lmsp_compacted")
    #: the items of the conversation it continues (attached when it is read; stored
    #: inline only by versions before history was kept by reference)
    history: Items | None = field(default=None, name="lmsp_history")

    @property
    def turn(self) -> tuple[str, int] | None:
        """The conversation it is a turn of and the ``seq`` of the last item its context
        holds (``None``: it was not made with ``conversation``)."""
        if self.conversation is None or self.conversation_upto is None:
            return None
        return self.conversation.id, self.conversation_upto


def prepared(create: CreateRequest, given_input: Items, **changes: Any) -> PreparedRequest:
    """The prepared form of ``create``: its shared fields, ``given_input`` as its
    input, and ``changes``."""
    shared = {name: getattr(create, name) for name in SHARED}
    return PreparedRequest(**{**shared, "input": given_input, **changes})


def sampling_used(
    request: RequestFields, defaults: dict[str, float | int] | None = None
) -> dict[str, float | int]:
    """The sampling numbers a request runs with: its own, else ``defaults`` (a model's),
    else lmsp's. Stored with the request when it is created, so the runner uses and
    every rendering of the response echoes the same numbers."""
    given = {k: v for k, v in (defaults or {}).items() if k in MODEL_DEFAULTS and v is not None}
    chosen = dict(SAMPLING_DEFAULTS, **given)
    out: dict[str, float | int] = {}
    for name, default in chosen.items():
        own = getattr(request, name)
        out[name] = type(SAMPLING_DEFAULTS[name])(own if own is not None else default)
    return out


# -- stored and read back ------------------------------------------------------------------
_DECODER = msgspec.json.Decoder(PreparedRequest)
_ENCODER = msgspec.json.Encoder()


def dumps(request: PreparedRequest) -> str:
    """The request as the store keeps it: its history by reference (not in the row)."""
    if request.history is not None:
        request = msgspec.structs.replace(request, history=None)
    return _ENCODER.encode(request).decode()


def loads(text: str | bytes) -> PreparedRequest:
    """A stored request (any version's)."""
    try:
        return _DECODER.decode(text)
    except msgspec.ValidationError:
        return _legacy(json.loads(text))


def from_stored(data: dict[str, Any]) -> PreparedRequest:
    """A stored request's JSON data, as parsed (any version's)."""
    try:
        return msgspec.convert(data, PreparedRequest)
    except msgspec.ValidationError:
        return _legacy(data)


def _legacy(data: dict[str, Any]) -> PreparedRequest:
    """A row stored before input items were normalized (its input is normalized now,
    with placeholder ids, as it always was when it was read), a bare ``stop`` string, or
    a conversation named by its id alone."""
    fixed = dict(data)
    fixed["input"] = _old_items(fixed.get("input"))
    if fixed.get(HISTORY) is not None:
        fixed[HISTORY] = _old_items(fixed[HISTORY])
    if isinstance(fixed.get("stop"), str):
        fixed["stop"] = [fixed["stop"]]
    if isinstance(fixed.get("conversation"), str):
        fixed["conversation"] = {"id": fixed["conversation"]}
    return msgspec.convert(fixed, PreparedRequest)


def _placeholder(prefix: str) -> str:
    return prefix


def _old_items(given: Any) -> list[Any]:
    """Items as a version before normalized them (or some of them)."""
    if not items.is_normalized(given):
        return items.normalize(given, make_id=_placeholder)
    out = []
    for index, item in enumerate(given):
        try:
            typed([item])
        except msgspec.ValidationError:
            item = items.normalize_item(item, f"input.{index}", make_id=_placeholder)
        out.append(item)
    return out


__all__ = ["CreateRequest", "Items", "PreparedRequest", "typed"]
