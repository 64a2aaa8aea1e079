"""Chat Completions on the Responses core (pure).

A chat completion is stored as a response: its ``messages`` become Responses input items
(so one prompt builder serves both APIs), and its answers are rendered from the response
object (``chat.completion``) or from the response's event log (``chat.completion.chunk``).
The completion's ``id`` is its response's id, so ``GET /v1/responses/{id}`` and the
task's event log show it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lmsp.protocol import events as ev

Item = dict[str, Any]


# -- messages → input items ---------------------------------------------------------------
@dataclass(frozen=True)
class Translated:
    """The input items, and for each item the index of the message it came from."""

    items: list[Item]
    origin: list[int]


class Untranslatable(ValueError):
    """A message that has no Responses form; ``param`` names it (``messages.3.content``),
    ``code`` says whether it is malformed (``invalid_value``) or beyond lmsp
    (``unsupported_input``)."""

    def __init__(self, param: str, message: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.message = message
        self.code = code


def _part(part: dict[str, Any], role: str, where: str) -> dict[str, Any]:
    kind = part["type"]
    if kind == "text":
        kind = "output_text" if role == "assistant" else "input_text"
        return {"type": kind, "text": part["text"]}
    if kind == "refusal":
        return {"type": "refusal", "refusal": part["refusal"]}
    if kind == "image_url":
        image = part["image_url"]
        return {"type": "input_image", "image_url": image["url"], "detail": image.get("detail")}
    if kind == "file":
        file = part["file"]
        return {"type": "input_file", **{k: v for k, v in file.items() if v is not None}}
    raise Untranslatable(where, f"{where}: {kind!r} content is not supported.", "unsupported_input")


def _content(message: dict[str, Any], where: str) -> str | list[dict[str, Any]] | None:
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content
    parts = []
    for index, part in enumerate(content):
        needed = part["type"]  # each part type carries its value under its own name
        if part.get(needed) is None:
            raise Untranslatable(
                f"{where}.{index}.{needed}", f"{where}.{index}: a {needed} part needs {needed}."
            )
        parts.append(_part(part, message["role"], f"{where}.{index}"))
    return parts


def items_from_messages(messages: list[dict[str, Any]]) -> Translated:
    """Chat ``messages`` as Responses input items: ``system``/``developer``/``user``/
    ``assistant`` messages as ``message`` items, an assistant's ``tool_calls`` as
    ``function_call`` items, ``tool`` messages as ``function_call_output`` items."""
    items: list[Item] = []
    origin: list[int] = []
    calls_seen: dict[str, str] = {}  # each call's id, unique in the request: where it is
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        role = message["role"]
        content = _content(message, f"{where}.content")
        if role == "function":
            raise Untranslatable(
                f"{where}.role",
                f"{where}: function messages are deprecated; use tool messages.",
                "unsupported_input",
            )
        if role == "tool":
            if message.get("tool_call_id") is None:
                raise Untranslatable(f"{where}.tool_call_id", f"{where}: needs tool_call_id.")
            if content is None:
                raise Untranslatable(f"{where}.content", f"{where}: needs content.")
            output = content if isinstance(content, str) else _joined(content)
            call_id = message["tool_call_id"]
            items.append({"type": "function_call_output", "call_id": call_id, "output": output})
            origin.append(index)
            continue
        calls = (message.get("tool_calls") or []) if role == "assistant" else []
        if role == "assistant" and message.get("refusal"):
            content = [*_as_parts(content), {"type": "refusal", "refusal": message["refusal"]}]
        if content is None and not calls:
            raise Untranslatable(f"{where}.content", f"{where}: needs content.")
        if content is not None:
            items.append({"type": "message", "role": role, "content": content})
            origin.append(index)
        for number, call in enumerate(calls):
            at = f"{where}.tool_calls.{number}.id"
            first = calls_seen.setdefault(call["id"], at)
            if first != at:
                raise Untranslatable(
                    at, f"{at}: tool call ids must be unique: {call['id']!r} is {first} too."
                )
            items.append(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": call["function"]["name"],
                    "arguments": call["function"]["arguments"],
                }
            )
            origin.append(index)
    return Translated(items, origin)


def _as_parts(content: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "output_text", "text": content}]
    return content


def _joined(parts: list[dict[str, Any]]) -> str:
    return "".join(str(part.get("text", "")) for part in parts)


# -- response object → chat.completion ------------------------------------------------------
def finish_reason(response: dict[str, Any]) -> str:
    if any(item.get("type") == "function_call" for item in response.get("output") or []):
        return "tool_calls"
    if response["status"] == "incomplete":
        return "length"
    return "stop"


def usage(response: dict[str, Any]) -> dict[str, Any] | None:
    used = response.get("usage")
    if used is None:
        return None
    return {
        "prompt_tokens": used["input_tokens"],
        "completion_tokens": used["output_tokens"],
        "total_tokens": used["total_tokens"],
        "prompt_tokens_details": {
            "cached_tokens": used["input_tokens_details"]["cached_tokens"],
            "audio_tokens": 0,
        },
        "completion_tokens_details": {
            "reasoning_tokens": used["output_tokens_details"]["reasoning_tokens"],
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def message(response: dict[str, Any]) -> dict[str, Any]:
    """The assistant message of a finished response."""
    output = response.get("output") or []
    texts = [
        part.get("text", "")
        for item in output
        if item.get("type") == "message"
        for part in item.get("content", [])
        if part.get("type") == "output_text"
    ]
    calls = [
        {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]},
        }
        for item in output
        if item.get("type") == "function_call"
    ]
    shown: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(texts) if texts or not calls else None,
        "refusal": None,
        "annotations": [],
    }
    if calls:
        shown["tool_calls"] = calls
    return shown


def completion(response: dict[str, Any]) -> dict[str, Any]:
    """The ``chat.completion`` object of a finished response."""
    return {
        "id": response["id"],
        "object": "chat.completion",
        "created": response["created_at"],
        "model": response["model"],
        "choices": [
            {
                "index": 0,
                "message": message(response),
                "finish_reason": finish_reason(response),
                "logprobs": None,
            }
        ],
        "usage": usage(response),
        "service_tier": response.get("service_tier") or "default",
        "system_fingerprint": response.get("model_digest"),
    }


# -- event log → chat.completion.chunk ------------------------------------------------------
@dataclass
class ChunkStream:
    """Turns a response's log events into chat completion chunks (and, for a failed or
    cancelled response, one ``{"error": …}`` payload, as OpenAI streams errors)."""

    response_id: str
    created: int
    model: str
    include_usage: bool = False
    fingerprint: str | None = None
    started: bool = False
    ended: bool = False
    _calls: dict[int, int] = field(default_factory=dict)  # output index → tool call index

    def _chunk(
        self, delta: dict[str, Any], finish: str | None = None, choices: bool = True
    ) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.response_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": (
                [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
                if choices
                else []
            ),
        }
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def _start(self) -> list[dict[str, Any]]:
        if self.started:
            return []
        self.started = True
        return [self._chunk({"role": "assistant", "content": "", "refusal": None})]

    def feed(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        kind = event["type"]
        response = event.get("response")
        if isinstance(response, dict) and response.get("model_digest"):
            self.fingerprint = response["model_digest"]
        if kind == ev.IN_PROGRESS:
            return self._start()
        if kind == ev.OUTPUT_TEXT_DELTA:
            if not event["delta"]:
                return []
            return [*self._start(), self._chunk({"content": event["delta"]})]
        if kind == ev.OUTPUT_ITEM_ADDED and event["item"]["type"] == "function_call":
            item = event["item"]
            index = self._calls.setdefault(event["output_index"], len(self._calls))
            call = {
                "index": index,
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": ""},
            }
            return [*self._start(), self._chunk({"tool_calls": [call]})]
        if kind == ev.FUNCTION_CALL_ARGUMENTS_DELTA:
            index = self._calls.get(event["output_index"], 0)
            call = {"index": index, "function": {"arguments": event["delta"]}}
            return [*self._start(), self._chunk({"tool_calls": [call]})]
        if kind in (ev.COMPLETED, ev.INCOMPLETE):
            self.ended = True
            assert isinstance(response, dict)
            out = [*self._start(), self._chunk({}, finish_reason(response))]
            if self.include_usage:
                out.append({**self._chunk({}, choices=False), "usage": usage(response)})
            return out
        if kind in (ev.FAILED, ev.CANCELLED):
            self.ended = True
            assert isinstance(response, dict)
            return [{"error": error_of(response)}]
        return []


def error_of(response: dict[str, Any]) -> dict[str, Any]:
    """Why a failed or cancelled response has no completion: ``{"code", "message"}``."""
    if response["status"] == "cancelled":
        return {"code": "cancelled", "message": "The completion was cancelled."}
    error = response.get("error") or {}
    return {
        "code": error.get("code") or "engine_error",
        "message": error.get("message") or "The completion failed.",
    }
