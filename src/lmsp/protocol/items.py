"""Input items (pure): a request's ``input`` checked into a normalized list of items, and
those items rendered as chat messages for the model's chat template.

``input`` is a string (one user message) or a list of items:

- ``message`` (``type`` optional): role ``system``, ``developer``, ``user`` or
  ``assistant``; ``content`` a string or a list of parts: ``input_text``, ``output_text``,
  ``refusal``, ``input_file`` (``file_data`` as base64 or a ``data:`` URL, with a
  ``filename``: plain text, Markdown, JSON, CSV or PDF) and ``input_image`` (refused
  unless the model has the ``vision`` capability, which no engine here has);
- ``function_call`` (``call_id``, ``name``, ``arguments``) and ``function_call_output``
  (``call_id``, ``output``: a string or ``input_text`` parts).

Nothing is dropped: an unknown item type, part type or field is a ``400`` naming it
(``input.2.content.1``, as the API names every field). Validation runs when a request
is created, so nothing is written for a bad one; the normalized items (each with an
``id``) are what the store keeps, what ``GET /v1/responses/{id}/input_items`` lists and
what later turns of a conversation carry.

A file's text is not read here: :func:`normalize` checks only what is cheap (base64, the
size, a supported type), and the API then turns each file into text once, under limits
(:mod:`lmsp.protocol.filetext`), and keeps it with the part as :data:`FILE_TEXT` —
which rendering uses, every turn after.

Chat templates differ in how they show tool calls, and small ones (SmolLM2's) have no
tool role at all, so calls are rendered generically, in the Hermes/Qwen style the tools
work generates: an assistant message holding
``<tool_call>{"name": …, "arguments": …}</tool_call>`` and a user message holding
``<tool_response>…</tool_response>`` (:func:`render_tool_call`,
:func:`render_tool_response`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec

from lmsp.errors import LmspError
from lmsp.ids import new_id
from lmsp.protocol import compaction, filetext, mcpitems, toolcalls
from lmsp.protocol.fields import only_fields
from lmsp.protocol.filetext import MAX_FILE_BYTES, MAX_FILE_TEXT, file_format
from lmsp.protocol.itemtypes import (
    AdditionalTools,
    Compaction,
    FunctionCall,
    FunctionCallOutput,
    InputFile,
    InputItem,
    InputText,
    Items,
    McpApprovalRequest,
    Message,
    OutputText,
    Part,
    Refusal,
)

__all__ = ["MAX_FILE_BYTES", "MAX_FILE_TEXT", "file_format"]

Item = dict[str, Any]
#: a chat message for the model's template
ChatMessage = dict[str, str]

#: an ``input_file`` part's key for the text it gives the model, read once when the
#: request was created (never sent by a client, never listed back)
FILE_TEXT = "lmsp_text"
ROLES = ("system", "developer", "user", "assistant")

#: the fields each item and part type may carry (anything else is refused, never dropped)
_MESSAGE_KEYS = {"type", "role", "content", "id", "status", "phase"}
#: an assistant message's ``phase`` (Open Responses 2026-04-24): kept and listed back,
#: not shown to the model
PHASES = ("commentary", "final_answer")
_CALL_KEYS = {"type", "call_id", "name", "arguments", "id", "status", "namespace"}
_OUTPUT_KEYS = {"type", "call_id", "output", "id", "status"}
_PART_KEYS = {
    "input_text": {"type", "text"},
    "output_text": {"type", "text", "annotations", "logprobs"},
    "refusal": {"type", "refusal"},
    "input_file": {"type", "file_data", "filename", "file_id", "file_url"},
    "input_image": {"type", "image_url", "file_id", "detail"},
}


def _error(param: str, message: str, code: str = "invalid_value") -> LmspError:
    return LmspError(code, f"{param}: {message}", param=param)


def _unsupported(param: str, message: str) -> LmspError:
    return _error(param, message, "unsupported_input")


def _string(value: Any, param: str, *, empty: bool = True) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise _error(param, "must be a non-empty string." if not empty else "must be a string.")
    return value


# -- validation ---------------------------------------------------------------------------
def normalize(
    given: Any,
    *,
    capabilities: Iterable[str] = ("completion",),
    make_id: Callable[[str], str] = new_id,
    param: str = "input",
    compaction_key: bytes | None = None,
) -> list[Item]:
    """``input`` as a list of normalized items (``400`` naming the first problem); a
    ``compaction`` item is checked under ``compaction_key`` (refused without one)."""
    if isinstance(given, str):
        if not given:
            raise _error(param, "must not be empty.")
        return [_message("user", [{"type": "input_text", "text": given}], make_id("msg"))]
    if not isinstance(given, list) or not given:
        raise _error(param, "must be a string or a non-empty list of items.")
    caps = frozenset(capabilities)
    normalized = [
        _item(item, f"{param}.{index}", caps, make_id, compaction_key)
        for index, item in enumerate(given)
    ]
    _unique_calls(normalized, param)
    return normalized


def _unique_calls(normalized: list[Item], param: str) -> None:
    """Two ``function_call`` items with one ``call_id``: which call would an output
    answer? Refused (``400`` naming the second), as Anthropic refuses a repeated
    ``tool_use`` id."""
    seen: dict[str, int] = {}
    for index, item in enumerate(normalized):
        if item["type"] != "function_call":
            continue
        first = seen.setdefault(item["call_id"], index)
        if first != index:
            raise _error(
                f"{param}.{index}.call_id",
                f"call ids must be unique: {item['call_id']!r} is the call_id of"
                f" {param}.{first} too.",
            )


def no_call_for(call_id: str, where: str) -> LmspError:
    """``400``: a tool output that answers no call of the request or its history (as
    OpenAI refuses it)."""
    return _error(
        where,
        f"no function_call with call_id {call_id!r} precedes this function_call_output"
        " (in the input, or the history it continues).",
    )


def normalize_item(
    item: Any,
    where: str,
    *,
    capabilities: Iterable[str] = ("completion",),
    make_id: Callable[[str], str] = new_id,
) -> Item:
    """One item of ``input`` normalized; ``where`` names it in errors (``input.3``)."""
    return _item(item, where, frozenset(capabilities), make_id, None)


def _message(role: str, content: list[Item], item_id: str) -> Item:
    return {
        "type": "message",
        "id": item_id,
        "status": "completed",
        "role": role,
        "content": content,
    }


def _item(
    item: Any, where: str, caps: frozenset[str], make_id: Callable[[str], str], key: bytes | None
) -> Item:
    if not isinstance(item, dict):
        raise _error(where, "an item must be an object.")
    kind = item.get("type", "message")
    if kind == "message":
        return _message_item(item, where, caps, make_id)
    if kind == "function_call":
        only_fields(item, _CALL_KEYS, where, "function_call item")
        arguments = _string(item.get("arguments"), f"{where}.arguments")
        return {
            "type": "function_call",
            "id": _id(item, where, "fc", make_id),
            "call_id": _string(item.get("call_id"), f"{where}.call_id", empty=False),
            "name": _string(item.get("name"), f"{where}.name", empty=False),
            "arguments": arguments,
            "status": "completed",
            # a namespace's tool (tooldefs): the name alone is what the model saw
            **(
                {"namespace": _string(item["namespace"], f"{where}.namespace", empty=False)}
                if item.get("namespace") is not None
                else {}
            ),
        }
    if kind == "function_call_output":
        only_fields(item, _OUTPUT_KEYS, where, "function_call_output item")
        return {
            "type": "function_call_output",
            "id": _id(item, where, "fco", make_id),
            "call_id": _string(item.get("call_id"), f"{where}.call_id", empty=False),
            "output": _tool_output(item.get("output"), f"{where}.output", caps),
            "status": "completed",
        }
    if kind == "compaction":  # a summary /v1/responses/compact wrote
        return compaction.normalize(item, where, make_id, key)
    if isinstance(kind, str) and kind in mcpitems.INPUT_TYPES:
        return mcpitems.normalize(item, kind, where, _id(item, where, "mcpr", make_id))
    if kind == "additional_tools":
        # tools given in the input (Codex CLI's): read with the request's ``tools``
        # (lmsp.app.tooldefs); the item itself says nothing to the model
        tools = item.get("tools")
        if not isinstance(tools, list):
            raise _error(f"{where}.tools", "a list of tools.")
        return {"type": "additional_tools", "id": _id(item, where, "at", make_id), "tools": tools}
    shown = kind if isinstance(kind, str) else repr(kind)
    raise _unsupported(f"{where}.type", f"items of type {shown!r} are not supported.")


def _id(item: Item, where: str, prefix: str, make_id: Callable[[str], str]) -> str:
    given = item.get("id")
    if given is None:
        return make_id(prefix)
    return _string(given, f"{where}.id", empty=False)


def _message_item(
    item: Item, where: str, caps: frozenset[str], make_id: Callable[[str], str]
) -> Item:
    only_fields(item, _MESSAGE_KEYS, where, "message")
    role = item.get("role")
    if role not in ROLES:
        raise _error(f"{where}.role", f"role must be one of {', '.join(ROLES)}.")
    content = item.get("content")
    if isinstance(content, str):
        kind = "output_text" if role == "assistant" else "input_text"
        parts: list[Item] = [_text_part(kind, content)]
    elif isinstance(content, list) and content:
        parts = [
            _part(part, f"{where}.content.{index}", role, caps)
            for index, part in enumerate(content)
        ]
    else:
        raise _error(f"{where}.content", "must be a string or a non-empty list of parts.")
    message = _message(role, parts, _id(item, where, "msg", make_id))
    phase = item.get("phase")
    if phase is not None:
        if role != "assistant":
            raise LmspError(
                "unsupported_parameter",
                f"{where}.phase: phase is for assistant messages only.",
                param=f"{where}.phase",
            )
        if phase not in PHASES:
            raise _error(f"{where}.phase", f"phase must be one of {', '.join(PHASES)}.")
        message["phase"] = phase
    return message


def _text_part(kind: str, text: str) -> Item:
    if kind == "output_text":
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": kind, "text": text}


def _part(part: Any, where: str, role: str, caps: frozenset[str]) -> Item:
    if not isinstance(part, dict):
        raise _error(where, "a content part must be an object.")
    kind = part.get("type")
    if kind == "text":  # stored by lmsp before input items were normalized
        kind = "output_text" if role == "assistant" else "input_text"
        part = {**part, "type": kind}
    if kind not in _PART_KEYS:
        shown = kind if isinstance(kind, str) else repr(kind)
        raise _unsupported(f"{where}.type", f"content parts of type {shown!r} are not supported.")
    only_fields(part, _PART_KEYS[kind], where, f"{kind} part")
    if kind in ("input_text", "output_text"):
        return _text_part(kind, _string(part.get("text"), f"{where}.text"))
    if kind == "refusal":
        return {"type": "refusal", "refusal": _string(part.get("refusal"), f"{where}.refusal")}
    if kind == "input_image":
        raise _image(where, caps)
    if role not in ("user", "system", "developer"):
        raise _error(where, "files can only be given in user, system or developer messages.")
    return _file(part, where)


def _image(where: str, caps: frozenset[str]) -> LmspError:
    shown = ", ".join(sorted(caps)) or "none"
    return _unsupported(
        where,
        f"images need a model with vision support; this model has none (capabilities: {shown}).",
    )


def _tool_output(output: Any, where: str, caps: frozenset[str]) -> str | list[Item]:
    if isinstance(output, str):
        return output
    if not isinstance(output, list):
        raise _error(where, "must be a string or a list of input_text parts.")
    parts: list[Item] = []
    for index, part in enumerate(output):
        inner = f"{where}.{index}"
        if isinstance(part, dict) and part.get("type") == "input_image":
            raise _image(inner, caps)
        if not isinstance(part, dict) or part.get("type") != "input_text":
            kind = part.get("type") if isinstance(part, dict) else None
            raise _unsupported(
                f"{inner}.type", f"tool output parts of type {kind!r} are not supported."
            )
        only_fields(part, _PART_KEYS["input_text"], inner, "input_text part")
        parts.append(_text_part("input_text", _string(part.get("text"), f"{inner}.text")))
    return parts


# -- files --------------------------------------------------------------------------------
def _file(part: Item, where: str) -> Item:
    for unsupported in ("file_id", "file_url"):
        if part.get(unsupported) is not None:
            raise _unsupported(
                f"{where}.{unsupported}",
                f"{unsupported} is not supported (lmsp has no file store): send file_data.",
            )
    data = part.get("file_data")
    filename = part.get("filename")
    if not isinstance(data, str) or not data:
        raise _error(f"{where}.file_data", "an input_file needs file_data (base64 or a data: URL).")
    if not isinstance(filename, str) or not filename or len(filename) > 256:
        raise _error(f"{where}.filename", "an input_file needs a filename (up to 256 characters).")
    file_bytes(data, filename, where)  # a file, of a type lmsp reads: its text comes later
    return {"type": "input_file", "filename": filename, "file_data": data}


def file_bytes(data: str, filename: str, where: str = "input_file") -> tuple[bytes, str]:
    """The bytes of an ``input_file`` and its format (``400`` naming ``where`` when it
    is no file, or of a type lmsp does not read)."""
    try:
        raw, media = filetext.decode(data)
    except filetext.BadData as exc:
        raise _error(f"{where}.file_data", exc.message) from None
    kind = file_format(filename, media)
    if kind is None:
        raise _unsupported(
            where,
            f"the file {filename!r} is not a supported type: send plain text, Markdown, JSON,"
            " CSV or PDF (by extension or data: URL media type).",
        )
    return raw, kind


def file_error(where: str, extracted: filetext.Extracted) -> LmspError:
    """The refusal of a file that gave no text (``where`` names its part)."""
    return LmspError(
        extracted.code, f"{where}.file_data: {extracted.message}", param=f"{where}.file_data"
    )


def files_of(given: Items) -> list[tuple[str, InputFile]]:
    """The ``input_file`` parts of items whose text is not read yet, with where each
    sits (``3.content.1``: prefix it with the input's own name)."""
    found: list[tuple[str, InputFile]] = []
    for index, item in enumerate(given):
        if not isinstance(item, Message):
            continue
        for at, part in enumerate(item.content):
            if isinstance(part, InputFile) and isinstance(part.text, msgspec.UnsetType):
                found.append((f"{index}.content.{at}", part))
    return found


def with_file_texts(given: Items, texts: dict[str, str]) -> Items:
    """``given`` with each file's text (``texts``: by where :func:`files_of` says the
    part is) kept with its part."""
    if not texts:
        return given
    out: list[InputItem] = []
    for index, item in enumerate(given):
        if isinstance(item, Message) and any(k.startswith(f"{index}.") for k in texts):
            content = tuple(
                msgspec.structs.replace(part, text=texts[f"{index}.content.{at}"])
                if f"{index}.content.{at}" in texts and isinstance(part, InputFile)
                else part
                for at, part in enumerate(item.content)
            )
            item = msgspec.structs.replace(item, content=content)
        out.append(item)
    return tuple(out)


def file_text(data: str, filename: str, where: str = "input_file") -> str:
    """The text an ``input_file`` gives the model, read in this process with no limits
    but the output's (``400`` when there is none): for rows stored before the text was
    kept with the part, whose files were read once already when they were created."""
    raw, kind = file_bytes(data, filename, where)
    extracted = filetext.extract(raw, kind)
    if extracted.text is None:
        raise file_error(where, extracted)
    return extracted.text


# -- rendering ----------------------------------------------------------------------------
def render_tool_call(name: str, arguments: str) -> str:
    """An assistant's function call as prompt text (and as the tools work parses it)."""
    try:
        parsed: Any = json.loads(arguments) if arguments else {}
    except ValueError:
        parsed = arguments
    # the format the model generates calls in (:mod:`lmsp.protocol.toolcalls`)
    return toolcalls.render_call(name, json.dumps(parsed, ensure_ascii=False))


def render_tool_response(output: str) -> str:
    """A function call's output as prompt text."""
    return f"<tool_response>\n{output}\n</tool_response>"


def _file_block(part: InputFile) -> str:
    text = part.text
    if isinstance(text, msgspec.UnsetType):
        text = file_text(part.file_data, part.filename)
    return f"[file: {part.filename}]\n{text}\n[end of file: {part.filename}]"


def _content_text(parts: Sequence[Part]) -> str:
    """The parts of a message as one text: text runs joined as given, files as blocks."""
    chunks: list[str] = []
    run = ""
    for part in parts:
        if isinstance(part, InputText | OutputText):
            run += part.text
        elif isinstance(part, Refusal):
            run += part.refusal
        else:  # input_file
            if run:
                chunks.append(run)
                run = ""
            chunks.append(_file_block(part))
    if run:
        chunks.append(run)
    return "\n\n".join(chunks)


def _output_text(output: str | tuple[InputText, ...]) -> str:
    return output if isinstance(output, str) else "".join(part.text for part in output)


def render(given: Sequence[InputItem], instructions: str | None = None) -> list[ChatMessage]:
    """Chat messages for the model's template: ``instructions`` first as the system
    message; ``developer`` becomes ``system``; a run of function calls joins the
    assistant message before it, a run of outputs makes one user message."""
    out: list[ChatMessage] = []
    if instructions:
        out.append({"role": "system", "content": instructions})

    def add(role: str, text: str, join: bool) -> None:
        if join and out and out[-1]["role"] == role:
            out[-1] = {"role": role, "content": f"{out[-1]['content']}\n{text}"}
        else:
            out.append({"role": role, "content": text})

    previous = ""
    requests: dict[str, McpApprovalRequest] = {}
    for item in given:
        kind = item.type
        if kind in mcpitems.INPUT_TYPES:  # the MCP loop's items (protocol/mcpitems.py)
            for role, text in mcpitems.render(item, requests):
                add(role, text, join=role == "assistant")
        elif isinstance(item, Message):
            role = "system" if item.role == "developer" else item.role
            add(role, _content_text(item.content), join=False)
        elif isinstance(item, Compaction):
            add("user", compaction.render_text(item), join=False)
        elif isinstance(item, FunctionCall):
            # the calls an assistant makes follow its text in one message
            add("assistant", render_tool_call(item.name, item.arguments), join=True)
        elif isinstance(item, AdditionalTools):
            continue  # its tools are the request's (offered as tools, not as text)
        elif isinstance(item, FunctionCallOutput):
            text = render_tool_response(_output_text(item.output))
            add("user", text, join=previous == "function_call_output")
        previous = kind
    return out


def is_normalized(given: Any) -> bool:
    """Is ``given`` a list :func:`normalize` made (every item typed and with an id)?"""
    return isinstance(given, list) and all(
        isinstance(item, dict) and "type" in item and "id" in item for item in given
    )
