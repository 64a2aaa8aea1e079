"""Legacy text completions (``POST /v1/completions``) on the Responses core (pure).

A completion is stored as a response whose one input item is the prompt, marked
:data:`RAW` in the stored request: the model reads that text as it is, without the chat
template (which is what a text completion means). The prompt reaches the engine as one
message of the role :data:`RAW_ROLE`, which no API lets a client write; the engines'
tokenizers give it to the model verbatim (:func:`raw_prompt`). The answers are rendered
from the response object (:func:`completion`) or its event log (:class:`CompletionStream`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmsp.protocol import events as ev
from lmsp.protocol.chat import error_of, usage

#: the stored request's key that marks its input as a raw prompt
RAW = "lmsp_raw_prompt"
#: the role of the one message that carries a raw prompt to the engine
RAW_ROLE = "lmsp.raw_prompt"


def raw_messages(text: str) -> list[dict[str, str]]:
    """The messages that hand ``text`` to the engine as a raw prompt."""
    return [{"role": RAW_ROLE, "content": text}]


def raw_prompt(messages: list[dict[str, str]]) -> str | None:
    """The raw prompt these messages carry, or ``None`` for chat messages (the template's)."""
    if len(messages) == 1 and messages[0].get("role") == RAW_ROLE:
        return messages[0]["content"]
    return None


def finish_reason(response: dict[str, Any]) -> str:
    return "length" if response["status"] == "incomplete" else "stop"


def text_of(response: dict[str, Any]) -> str:
    return "".join(
        part.get("text", "")
        for item in response.get("output") or []
        if item.get("type") == "message"
        for part in item.get("content", [])
        if part.get("type") == "output_text"
    )


def _object(response_id: str, created: int, model: str, fingerprint: str | None) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint,
    }


def completion(response: dict[str, Any]) -> dict[str, Any]:
    """The ``text_completion`` object of a finished response."""
    shown = _object(
        response["id"], response["created_at"], response["model"], response.get("model_digest")
    )
    shown["choices"] = [
        {
            "text": text_of(response),
            "index": 0,
            "logprobs": None,
            "finish_reason": finish_reason(response),
        }
    ]
    shown["usage"] = usage(response)
    return shown


@dataclass
class CompletionStream:
    """Turns a response's log events into ``text_completion`` chunks (and, for a failed
    or cancelled response, one ``{"error": …}`` payload, as OpenAI streams errors)."""

    response_id: str
    created: int
    model: str
    include_usage: bool = False
    fingerprint: str | None = None

    def _chunk(self, text: str, finish: str | None) -> dict[str, Any]:
        chunk = _object(self.response_id, self.created, self.model, self.fingerprint)
        chunk["choices"] = [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def feed(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        kind = event["type"]
        response = event.get("response")
        if isinstance(response, dict) and response.get("model_digest"):
            self.fingerprint = response["model_digest"]
        if kind == ev.OUTPUT_TEXT_DELTA:
            return [self._chunk(event["delta"], None)] if event["delta"] else []
        if kind in (ev.COMPLETED, ev.INCOMPLETE):
            assert isinstance(response, dict)
            out = [self._chunk("", finish_reason(response))]
            if self.include_usage:
                last = _object(self.response_id, self.created, self.model, self.fingerprint)
                out.append({**last, "choices": [], "usage": usage(response)})
            return out
        if kind in (ev.FAILED, ev.CANCELLED):
            assert isinstance(response, dict)
            return [{"error": error_of(response)}]
        return []
