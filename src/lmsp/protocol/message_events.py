"""A response's event log as the Anthropic Messages API's stream events (pure): what
``POST /v1/messages`` with ``stream: true`` and ``GET /v1/messages/{id}?stream=true``
send, from the same log every other API reads (:mod:`lmsp.protocol.messages` renders
the finished message)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lmsp.protocol import events as ev
from lmsp.protocol.messages import Block, stop_reason, usage

Out = tuple[str, dict[str, Any]]


@dataclass
class MessageEvents:
    """Turns a response's log events into Anthropic stream events: ``message_start``
    first, then per block ``content_block_start``/``_delta``…/``_stop``, then
    ``message_delta`` (stop reason, usage) and ``message_stop``; a failed or cancelled
    response ends with one ``error`` event. A text block starts with its first text, so
    an empty message makes no block. :meth:`feed` returns ``(event name, payload)``."""

    message_id: str
    model: str
    started: bool = False
    ended: bool = False
    stop_sequence: str | None = None
    _blocks: int = 0  # blocks started so far (the next block's index)
    _open: dict[int, int | None] = field(default_factory=dict)  # output index → block
    _calls: bool = False

    def _start(self) -> list[Out]:
        if self.started:
            return []
        self.started = True
        shown: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": 0,
            },
        }
        return [("message_start", {"type": "message_start", "message": shown})]

    def _open_block(self, output_index: int, block: Block) -> Out:
        index = self._blocks
        self._blocks += 1
        self._open[output_index] = index
        payload = {"type": "content_block_start", "index": index, "content_block": block}
        return ("content_block_start", payload)

    def _delta(self, index: int, delta: dict[str, Any]) -> Out:
        return ("content_block_delta", {"type": "content_block_delta", "index": index, **delta})

    def feed(self, event: dict[str, Any]) -> list[Out]:
        if self.ended:
            return []
        out = self._start()
        kind = event["type"]
        handler = self._handlers().get(kind)
        if handler is not None:
            out += handler(event)
        return out

    def _handlers(self) -> dict[str, Callable[[dict[str, Any]], list[Out]]]:
        return {
            ev.OUTPUT_ITEM_ADDED: self._added,
            ev.OUTPUT_TEXT_DELTA: self._text,
            ev.FUNCTION_CALL_ARGUMENTS_DELTA: self._arguments,
            ev.OUTPUT_TEXT_DONE: self._text_done,
            ev.OUTPUT_ITEM_DONE: self._done,
            ev.QUEUED: self._queued,
            ev.COMPLETED: self._finished,
            ev.INCOMPLETE: self._finished,
            ev.FAILED: self._failed,
            ev.CANCELLED: self._failed,
        }

    def _added(self, event: dict[str, Any]) -> list[Out]:
        item = event["item"]
        if item["type"] != "function_call":
            self._open[event["output_index"]] = None  # a text block starts with its text
            return []
        self._calls = True
        block = {"type": "tool_use", "id": item["call_id"], "name": item["name"], "input": {}}
        return [self._open_block(event["output_index"], block)]

    def _text(self, event: dict[str, Any]) -> list[Out]:
        if not event["delta"]:
            return []
        out: list[Out] = []
        index = self._open.get(event["output_index"])
        if index is None:
            out.append(self._open_block(event["output_index"], {"type": "text", "text": ""}))
            index = self._blocks - 1
        out.append(self._delta(index, {"delta": {"type": "text_delta", "text": event["delta"]}}))
        return out

    def _arguments(self, event: dict[str, Any]) -> list[Out]:
        index = self._open.get(event["output_index"])
        if index is None or not event["delta"]:
            return []
        delta = {"type": "input_json_delta", "partial_json": event["delta"]}
        return [self._delta(index, {"delta": delta})]

    def _text_done(self, event: dict[str, Any]) -> list[Out]:
        found = event.get("stop_sequence")
        if isinstance(found, str):
            self.stop_sequence = found
        return []

    def _done(self, event: dict[str, Any]) -> list[Out]:
        index = self._open.pop(event["output_index"], None)
        if index is None:
            return []
        return [("content_block_stop", {"type": "content_block_stop", "index": index})]

    def _queued(self, event: dict[str, Any]) -> list[Out]:
        """A retry's ``reset``: the output so far is void. Before any block nothing is
        lost; after one, the stream ends with an error telling how to follow it again."""
        if not event.get("reset"):
            return []
        if self._blocks == 0:
            self._open.clear()
            return []
        self.ended = True
        text = (
            "The task restarted from the beginning (on_restart: retry): the output streamed"
            f" so far is void. Follow it again: GET /v1/messages/{self.message_id}?stream=true"
        )
        return [error_event("api_error", text)]

    def _finished(self, event: dict[str, Any]) -> list[Out]:
        self.ended = True
        response = event["response"]
        out: list[Out] = []
        for output_index in list(self._open):
            out += self._done({"output_index": output_index})
        reason = stop_reason(response, self.stop_sequence)
        delta = {
            "stop_reason": reason,
            "stop_sequence": self.stop_sequence if reason == "stop_sequence" else None,
        }
        shown = usage(response)
        shown.pop("service_tier")
        out.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": shown}))
        out.append(("message_stop", {"type": "message_stop"}))
        return out

    def _failed(self, event: dict[str, Any]) -> list[Out]:
        self.ended = True
        kind, text = failure(event["response"])
        return [error_event(kind, text)]


def failure(response: dict[str, Any]) -> tuple[str, str]:
    """The Anthropic error type and message of a failed or cancelled response."""
    if response["status"] == "cancelled":
        return "api_error", "The message was cancelled before it was finished."
    error = response.get("error") or {}
    code = error.get("code") or "engine_error"
    kind = "invalid_request_error" if code == "context_length_exceeded" else "api_error"
    return kind, error.get("message") or "The message failed."


def error_event(kind: str, text: str) -> Out:
    return ("error", {"type": "error", "error": {"type": kind, "message": text}})
