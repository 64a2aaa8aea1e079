"""The items of a context, typed (pure): the :data:`InputItem` union and the parts of a
message, frozen.

:func:`lmsp.protocol.items.normalize` checks what a client sends (each refusal naming its
place) into the normalized JSON shape; :func:`typed` makes these objects of it, once.
Earlier output given back as input (a conversation's history: messages, function calls
and MCP items) is read into the same union. Each type's fields are the normalized
shape's, so an item encodes back to what the store always kept (:func:`plain`), and a
row written before is read as it is.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
from msgspec import UNSET, Struct, UnsetType, field


class Typed(Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type"):
    """A JSON object whose ``type`` says which of a union it is."""

    @property
    def type(self) -> str:
        return str(self.__struct_config__.tag)


# -- the parts of a message ------------------------------------------------------------------
class InputText(Typed, frozen=True, tag="input_text"):
    text: str


class OutputText(Typed, frozen=True, tag="output_text"):
    text: str
    annotations: tuple[Any, ...] | UnsetType = UNSET
    logprobs: tuple[Any, ...] | UnsetType = UNSET


class Refusal(Typed, frozen=True, tag="refusal"):
    refusal: str


class InputFile(Typed, frozen=True, tag="input_file"):
    filename: str
    file_data: str
    #: the text the model is given, read once when the request was created (never sent
    #: by a client, never listed back: :data:`lmsp.protocol.items.FILE_TEXT`)
    text: str | UnsetType = field(default=UNSET, name="lmsp_text")


Part = InputText | OutputText | Refusal | InputFile


# -- items -----------------------------------------------------------------------------------
class Message(Typed, frozen=True, tag="message"):
    id: str
    role: str
    content: tuple[Part, ...]
    status: str | UnsetType = UNSET
    #: an assistant message's ``commentary`` or ``final_answer`` (kept, not shown)
    phase: str | UnsetType = UNSET


class FunctionCall(Typed, frozen=True, tag="function_call"):
    id: str
    call_id: str
    name: str
    arguments: str
    status: str | UnsetType = UNSET
    #: a namespace's tool (:mod:`lmsp.app.tooldefs`): the name alone is what the model saw
    namespace: str | UnsetType = UNSET


class FunctionCallOutput(Typed, frozen=True, tag="function_call_output"):
    id: str
    call_id: str
    output: str | tuple[InputText, ...]
    status: str | UnsetType = UNSET


class Compaction(Typed, frozen=True, tag="compaction"):
    """A summary ``POST /v1/responses/compact`` wrote (:mod:`lmsp.protocol.compaction`)."""

    id: str
    encrypted_content: str
    created_by: str | UnsetType = UNSET


class McpApprovalResponse(Typed, frozen=True, tag="mcp_approval_response"):
    id: str
    approval_request_id: str
    approve: bool
    reason: str | UnsetType = UNSET


class McpToolCall(Typed, frozen=True):
    """What an MCP approval request asks to run and an ``mcp_call`` ran: a server's
    tool, with its arguments (JSON text)."""

    id: str
    server_label: str
    name: str
    arguments: str


class McpApprovalRequest(McpToolCall, frozen=True, tag="mcp_approval_request"):
    status: str | UnsetType = UNSET


class McpCall(McpToolCall, frozen=True, tag="mcp_call"):
    output: str | UnsetType | None = UNSET
    error: Any = UNSET
    status: str | UnsetType = UNSET
    approval_request_id: str | UnsetType = UNSET


class McpListTools(Typed, frozen=True, tag="mcp_list_tools"):
    id: str
    server_label: str
    tools: tuple[Any, ...]
    error: Any = UNSET


class AdditionalTools(Typed, frozen=True, tag="additional_tools"):
    """Tools given in the input (Codex CLI's): read with the request's ``tools``; the
    item itself says nothing to the model."""

    id: str
    tools: tuple[Any, ...]


InputItem = (
    Message
    | FunctionCall
    | FunctionCallOutput
    | Compaction
    | McpApprovalResponse
    | McpApprovalRequest
    | McpCall
    | McpListTools
    | AdditionalTools
)
Items = tuple[InputItem, ...]


def typed(normalized: Iterable[dict[str, Any]]) -> Items:
    """Normalized items (:func:`lmsp.protocol.items.normalize`, or items stored so) as
    the typed union."""
    return msgspec.convert(list(normalized), Items)


def typed_item(normalized: dict[str, Any]) -> InputItem:
    found: InputItem = msgspec.convert(normalized, InputItem)
    return found


_ITEMS = msgspec.json.Decoder(Items)
_ITEM: msgspec.json.Decoder[Any] = msgspec.json.Decoder(InputItem)
_ENCODER = msgspec.json.Encoder()


def loads(text: str | bytes) -> Items:
    """Stored items (a JSON list) as the union."""
    return _ITEMS.decode(text)


def loads_one(text: str | bytes) -> InputItem:
    found: InputItem = _ITEM.decode(text)
    return found


def dumps(value: Any) -> bytes:
    """Items (or anything holding them) as JSON."""
    return _ENCODER.encode(value)


def plain(item: Struct) -> dict[str, Any]:
    """An item as plain JSON data (lists, not tuples), e.g. to answer or store it as the
    JSON it always was."""
    found: dict[str, Any] = json.loads(_ENCODER.encode(item))
    return found


def plain_all(given: Sequence[InputItem]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(_ENCODER.encode(given))
    return found
