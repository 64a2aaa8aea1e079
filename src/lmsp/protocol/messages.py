"""The Anthropic Messages API on the Responses core (pure).

A message is stored as a response, like a chat completion: ``system`` becomes the
response's ``instructions``, ``messages`` become Responses input items (so one prompt
builder serves every API), ``tools``/``tool_choice`` their function-tool form (the same
constrained decoding enforces them), and the answer is rendered from the response
object (:func:`message`) or from the response's event log
(:class:`lmsp.protocol.message_events.MessageEvents`).
The message's ``id`` is its response's id, so ``GET /v1/responses/{id}`` and the task's
event log show it too.

Content blocks arrive as plain objects and are checked here, each refusal naming the
block (``messages.2.content.1``): ``text``, ``document`` (a PDF or text file, as an
``input_file``), ``tool_use`` and ``tool_result``; ``image`` (no model here has vision),
``thinking`` and every server-tool block are refused, never dropped.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

from lmsp.protocol import events as ev
from lmsp.protocol.chat import Translated, Untranslatable

Item = dict[str, Any]
Block = dict[str, Any]

#: the fields each input block type may carry (anything else is refused, as Anthropic does)
_BLOCK_KEYS: dict[str, set[str]] = {
    "text": {"type", "text", "cache_control", "citations"},
    "image": {"type", "source", "cache_control"},
    "document": {"type", "source", "title", "context", "citations", "cache_control"},
    "tool_use": {"type", "id", "name", "input", "cache_control", "caller"},
    "tool_result": {"type", "tool_use_id", "content", "is_error", "cache_control"},
}
#: blocks of models that think or of Anthropic's server tools: nothing here produces them
_FOREIGN = {
    "thinking": "the models here do not think; send no thinking blocks",
    "redacted_thinking": "the models here do not think; send no thinking blocks",
}
#: the error text a tool result marked ``is_error`` is prefixed with in the prompt
TOOL_ERROR = "Error: "
#: the names a tool may have here (the call grammar's)
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _refuse(where: str, message: str) -> Untranslatable:
    return Untranslatable(where, f"{where}: {message}", "unsupported_input")


def _invalid(where: str, message: str) -> Untranslatable:
    return Untranslatable(where, f"{where}: {message}")


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _invalid(where, "must be a string.")
    return value


def _check_keys(block: Block, kind: str, where: str) -> None:
    for key in block:
        if key not in _BLOCK_KEYS[kind]:
            raise _invalid(f"{where}.{key}", f"a {kind} block has no field {key!r}.")
    cache = block.get("cache_control")
    if cache is not None and (not isinstance(cache, dict) or cache.get("type") != "ephemeral"):
        raise _invalid(f"{where}.cache_control", 'cache_control must be {"type": "ephemeral"}.')


def _kind(block: Any, where: str) -> str:
    if not isinstance(block, dict):
        raise _invalid(where, "a content block must be an object.")
    kind = block.get("type")
    if not isinstance(kind, str):
        raise _invalid(f"{where}.type", "a content block needs a type.")
    if kind in _FOREIGN:
        raise _refuse(f"{where}.type", _FOREIGN[kind] + ".")
    if kind not in _BLOCK_KEYS:
        raise _refuse(f"{where}.type", f"{kind!r} blocks are not supported here.")
    _check_keys(block, kind, where)
    return kind


def _text_block(block: Block, where: str) -> str:
    if block.get("citations"):
        raise _refuse(f"{where}.citations", "citations are not supported here.")
    return _text(block.get("text"), f"{where}.text")


def _image(where: str) -> Untranslatable:
    """No model here has vision (the Responses API refuses ``input_image`` alike)."""
    return _refuse(where, "images need a model with vision support; no model here has it.")


def _document(block: Block, where: str) -> Item:
    """A PDF (base64) or plain-text document as an ``input_file`` part."""
    for unsupported in ("context", "citations"):
        if block.get(unsupported):
            raise _refuse(f"{where}.{unsupported}", f"document {unsupported} is not supported.")
    source = block.get("source")
    if not isinstance(source, dict):
        raise _invalid(f"{where}.source", "a document block needs a source.")
    kind = source.get("type")
    media = source.get("media_type")
    if kind == "base64" and media == "application/pdf":
        data, name = _text(source.get("data"), f"{where}.source.data"), "document.pdf"
    elif kind == "text" and media in (None, "text/plain"):
        text = _text(source.get("data"), f"{where}.source.data")
        data, name, media = base64.b64encode(text.encode()).decode(), "document.txt", "text/plain"
    else:
        raise _refuse(
            f"{where}.source",
            "documents are base64 PDFs or plain text here (no url, file or content sources).",
        )
    title = block.get("title")
    filename = title if isinstance(title, str) and title else name
    if "." not in filename.rsplit("/", 1)[-1]:
        filename += name[name.index(".") :]
    return {"type": "input_file", "filename": filename, "file_data": f"data:{media};base64,{data}"}


def _tool_result(block: Block, where: str) -> Item:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise _invalid(f"{where}.tool_use_id", "a tool_result needs its tool_use_id.")
    content = block.get("content", "")
    if isinstance(content, str):
        output = content
    elif isinstance(content, list):
        texts = []
        for index, inner in enumerate(content):
            inner_where = f"{where}.content.{index}"
            kind = _kind(inner, inner_where)
            if kind == "image":
                raise _image(inner_where)
            if kind != "text":
                raise _refuse(f"{inner_where}.type", "a tool result holds text blocks here.")
            texts.append(_text_block(inner, inner_where))
        output = "\n".join(texts)
    else:
        raise _invalid(f"{where}.content", "must be a string or a list of blocks.")
    is_error = block.get("is_error")
    if is_error not in (None, True, False):
        raise _invalid(f"{where}.is_error", "must be a boolean.")
    if is_error:
        output = TOOL_ERROR + output
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def _tool_use(block: Block, where: str) -> Item:
    call_id = block.get("id")
    name = block.get("name")
    given = block.get("input")
    if not isinstance(call_id, str) or not call_id:
        raise _invalid(f"{where}.id", "a tool_use needs an id.")
    if not isinstance(name, str) or not name:
        raise _invalid(f"{where}.name", "a tool_use needs a name.")
    if not isinstance(given, dict):
        raise _invalid(f"{where}.input", "a tool_use's input must be an object.")
    if block.get("caller") not in (None, {"type": "direct"}):
        raise _refuse(f"{where}.caller", "only direct tool calls exist here.")
    arguments = json.dumps(given, ensure_ascii=False)
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}


class _Message:
    """Collects one message's items: runs of text, image and document blocks make one
    message item; a ``tool_use`` is a ``function_call``, a ``tool_result`` a
    ``function_call_output``, in the order given."""

    def __init__(self, role: str, index: int, out: Translated) -> None:
        self.role = role
        self.index = index
        self.out = out
        self.parts: list[Item] = []

    def add(self, item: Item) -> None:
        self.flush()
        self.out.items.append(item)
        self.out.origin.append(self.index)

    def flush(self) -> None:
        if self.parts:
            self.out.items.append({"type": "message", "role": self.role, "content": self.parts})
            self.out.origin.append(self.index)
            self.parts = []


def _blocks(message: _Message, content: list[Any], where: str, uses: dict[str, str]) -> None:
    """The blocks of one message; ``uses`` maps each ``tool_use`` id met so far in the
    request to where it was (as Anthropic: ids are unique in the whole request)."""
    role = message.role
    text_kind = "output_text" if role == "assistant" else "input_text"
    for index, block in enumerate(content):
        at = f"{where}.{index}"
        kind = _kind(block, at)
        if kind == "text":
            message.parts.append({"type": text_kind, "text": _text_block(block, at)})
        elif kind == "tool_use":
            if role != "assistant":
                raise _invalid(f"{at}.type", "tool_use blocks belong in assistant messages.")
            call = _tool_use(block, at)
            first = uses.setdefault(call["call_id"], at)
            if first != at:
                raise _invalid(
                    f"{at}.id",
                    f"`tool_use` ids must be unique: {call['call_id']!r} is the id of {first} too.",
                )
            message.add(call)
        elif kind == "tool_result":
            if role != "user":
                raise _invalid(f"{at}.type", "tool_result blocks belong in user messages.")
            message.add(_tool_result(block, at))
        elif role == "assistant":
            raise _invalid(f"{at}.type", f"{kind} blocks belong in user messages.")
        elif kind == "image":
            raise _image(at)
        else:
            message.parts.append(_document(block, at))


def items_from_messages(messages: list[dict[str, Any]]) -> Translated:
    """Anthropic ``messages`` as Responses input items, each with the index of the
    message it came from. A last ``assistant`` message (a prefill the answer would
    continue) is refused: lmsp always starts a new assistant turn."""
    out = Translated([], [])
    uses: dict[str, str] = {}
    for index, given in enumerate(messages):
        where = f"messages.{index}"
        role, content = given["role"], given["content"]
        if isinstance(content, str):
            kind = "output_text" if role == "assistant" else "input_text"
            out.items.append(
                {"type": "message", "role": role, "content": [{"type": kind, "text": content}]}
            )
            out.origin.append(index)
            continue
        if not content:
            raise _invalid(f"{where}.content", "must be a string or a non-empty list of blocks.")
        if role == "system":
            texts = [_system_block(b, f"{where}.content.{i}") for i, b in enumerate(content)]
            part = {"type": "input_text", "text": "\n".join(texts)}
            out.items.append({"type": "message", "role": "system", "content": [part]})
            out.origin.append(index)
            continue
        if role == "user":
            _check_results(content, _uses(messages[index - 1] if index else None), where)
        message = _Message(role, index, out)
        _blocks(message, content, f"{where}.content", uses)
        message.flush()
    if messages and messages[-1]["role"] == "assistant":
        last = f"messages.{len(messages) - 1}"
        raise _refuse(
            last, "a last assistant message (prefill) is not supported; end with a user message."
        )
    return out


def _uses(message: dict[str, Any] | None) -> set[str]:
    """The ids of the ``tool_use`` blocks of ``message`` (an assistant's)."""
    if message is None or message.get("role") != "assistant":
        return set()
    content = message.get("content")
    if not isinstance(content, list):
        return set()
    return {
        str(block["id"])
        for block in content
        if isinstance(block, dict) and block.get("type") == "tool_use" and "id" in block
    }


def _check_results(content: list[Any], uses: set[str], where: str) -> None:
    """As Anthropic: each ``tool_result`` answers a ``tool_use`` of the message just
    before, and answers it once."""
    answered: set[str] = set()
    for index, block in enumerate(content):
        if not isinstance(block, dict) or block.get("type") != "tool_result":
            continue
        call_id = block.get("tool_use_id")
        if not isinstance(call_id, str):
            continue  # the block's own check says so
        at = f"{where}.content.{index}.tool_use_id"
        if call_id not in uses:
            raise _invalid(
                at,
                f"unexpected tool_use_id {call_id!r} in a tool_result block: each tool_result"
                " must answer a tool_use block of the previous (assistant) message.",
            )
        if call_id in answered:
            raise _invalid(at, f"the tool_use {call_id!r} is answered twice in this message.")
        answered.add(call_id)


def _system_block(block: Any, where: str) -> str:
    if _kind(block, where) != "text":
        raise _invalid(f"{where}.type", "system content holds text blocks.")
    return _text_block(block, where)


def system_text(system: str | list[Any] | None) -> str | None:
    """``system`` (a string or text blocks) as the response's ``instructions``."""
    if system is None or isinstance(system, str):
        return system or None
    return "\n".join(_system_block(block, f"system.{i}") for i, block in enumerate(system)) or None


# -- tools ------------------------------------------------------------------------------------
_TOOL_KEYS = {
    "type",
    "name",
    "description",
    "input_schema",
    "cache_control",
    "strict",
    "eager_input_streaming",
    "input_examples",
    "defer_loading",
    "allowed_callers",
}


def function_tools(tools: list[Any]) -> list[Item]:
    """Anthropic client tools as Responses ``function`` tools. A server tool (a ``type``
    such as ``web_search_20250305``) keeps its type, for the tool check to refuse it."""
    out: list[Item] = []
    for index, tool in enumerate(tools):
        where = f"tools.{index}"
        if not isinstance(tool, dict):
            raise _invalid(where, "a tool must be an object.")
        kind = tool.get("type")
        if kind not in (None, "custom"):
            out.append({"type": kind})
            continue
        for key in tool:
            if key not in _TOOL_KEYS:
                raise _invalid(f"{where}.{key}", f"a tool has no field {key!r}.")
        name = tool.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise _invalid(f"{where}.name", "a tool name is 1 to 64 of a-z, A-Z, 0-9, _ and -.")
        cache = tool.get("cache_control")
        if cache is not None and (not isinstance(cache, dict) or cache.get("type") != "ephemeral"):
            raise _invalid(f"{where}.cache_control", 'cache_control must be {"type": "ephemeral"}.')
        for key in ("input_examples", "defer_loading", "allowed_callers"):
            if tool.get(key):
                message = f"{where}.{key} is not supported here."
                raise Untranslatable(f"{where}.{key}", message, "unsupported_parameter")
        if tool.get("eager_input_streaming") is False:
            raise Untranslatable(
                f"{where}.eager_input_streaming",
                f"{where}.eager_input_streaming: tool input always streams as it is generated.",
                "unsupported_parameter",
            )
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise _invalid(f"{where}.input_schema", "a tool needs an input_schema object.")
        # not strict unless it says so (Anthropic's default): a keyword the grammar
        # cannot enforce is then checked after generation (lmsp.runner.relax)
        shown: Item = {
            "type": "function",
            "name": name,
            "parameters": schema,
            "strict": tool.get("strict") is True,
        }
        if tool.get("description") is not None:
            shown["description"] = _text(tool["description"], f"{where}.description")
        out.append(shown)
    return out


def tool_choice(choice: dict[str, Any] | None) -> tuple[Any, bool | None]:
    """``tool_choice`` in its Responses form, and ``parallel_tool_calls`` (``False`` with
    ``disable_parallel_tool_use``)."""
    if choice is None:
        return None, None
    parallel = False if choice.get("disable_parallel_tool_use") else None
    kind = choice["type"]
    if kind == "tool":
        return {"type": "function", "name": choice.get("name")}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[kind], parallel


def tools_param(*parts: str | int) -> str:
    """The Messages name of a place in the Responses form (for the tool check's errors)."""
    shown = [str(part) for part in parts]
    if shown[:1] == ["tools"] and len(shown) > 2 and shown[2] == "parameters":
        shown[2] = "input_schema"
    if shown[:2] == ["text", "format"]:
        shown = ["output_config", "format", *shown[2:]]
    if shown == ["stop"]:
        shown = ["stop_sequences"]
    return ".".join(shown)


# -- response object → message ----------------------------------------------------------------
def _input(arguments: str) -> Any:
    """A call's arguments as the ``input`` object (``{}`` if cut short before they parse)."""
    try:
        parsed = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def content(response: dict[str, Any]) -> list[Block]:
    """The content blocks of a response's output: its text (empty text left out) and
    its calls as ``tool_use`` blocks."""
    blocks: list[Block] = []
    for item in response.get("output") or []:
        if item.get("type") == "message":
            text = "".join(
                part.get("text") or part.get("refusal") or "" for part in item.get("content", [])
            )
            if text:
                blocks.append({"type": "text", "text": text})
        elif item.get("type") == "function_call":
            blocks.append(
                {
                    "type": "tool_use",
                    "id": item["call_id"],
                    "name": item["name"],
                    "input": _input(item.get("arguments", "")),
                }
            )
    return blocks


def stop_reason(response: dict[str, Any], stop_sequence: str | None) -> str | None:
    """Why the message ended: ``tool_use``, ``max_tokens`` (the request's limit) or
    ``model_context_window_exceeded`` (the context filled first), ``stop_sequence`` or
    ``end_turn``; ``None`` while it runs."""
    status = response["status"]
    if status == "incomplete":
        used = (response.get("usage") or {}).get("output_tokens", 0)
        limit = response.get("max_output_tokens")
        if limit is not None and used < limit:
            return "model_context_window_exceeded"
        return "max_tokens"
    if status != "completed":
        return None
    if any(item.get("type") == "function_call" for item in response.get("output") or []):
        return "tool_use"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def usage(response: dict[str, Any]) -> dict[str, Any]:
    """Anthropic usage: ``input_tokens`` are the prompt tokens evaluated, the ones read
    from a cached prefix are ``cache_read_input_tokens`` (their sum is the prompt)."""
    used = response.get("usage") or {}
    prompt = int(used.get("input_tokens", 0))
    cached = int((used.get("input_tokens_details") or {}).get("cached_tokens", 0))
    return {
        "input_tokens": prompt - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": int(used.get("output_tokens", 0)),
        "service_tier": "standard",
    }


def message(response: dict[str, Any], stop_sequence: str | None = None) -> dict[str, Any]:
    """The ``message`` object of a response (``stop_reason`` ``None`` while it runs)."""
    reason = stop_reason(response, stop_sequence)
    return {
        "id": response["id"],
        "type": "message",
        "role": "assistant",
        "model": response["model"],
        "content": content(response),
        "stop_reason": reason,
        "stop_sequence": stop_sequence if reason == "stop_sequence" else None,
        "usage": usage(response),
    }


def stop_sequence_of(logged: list[dict[str, Any]]) -> str | None:
    """The stop sequence that ended the output, from the log's ``output_text.done``
    events (the assembler notes it there)."""
    for event in reversed(logged):
        if event.get("type") == ev.OUTPUT_TEXT_DONE:
            found = event.get("stop_sequence")
            return found if isinstance(found, str) else None
    return None
