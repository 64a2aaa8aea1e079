"""The output assembler: typed engine outputs → Responses events and output items.

An engine produces text deltas (and, with tools, function calls); the assembler opens
and closes output items around them and builds every output event in the order the
Responses API gives (``output_item.added``, ``content_part.added``, deltas, the
``.done`` events). It is pure: ids come from a factory, events carry no sequence
number (the log numbers them), and :meth:`OutputAssembler.replay` rebuilds the same
state from the events it emitted, so a resumed task continues exactly where its log
ends.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from lmsp.ids import new_id
from lmsp.protocol import events as ev


@dataclass(frozen=True)
class TextDelta:
    """Text the model produced. ``logprobs``: one entry per token, when asked for."""

    text: str
    logprobs: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class CallStart:
    """The model starts a function call to ``name``."""

    name: str
    call_id: str | None = None


@dataclass(frozen=True)
class ArgumentsDelta:
    """More of the current call's JSON arguments."""

    delta: str


@dataclass(frozen=True)
class CallEnd:
    """The current call's arguments are complete."""


EngineOutput = TextDelta | CallStart | ArgumentsDelta | CallEnd
ItemStatus = Literal["completed", "incomplete"]
Event = dict[str, Any]


def text_part(text: str = "", logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


class OutputAssembler:
    """Builds one response's output. Feed it engine outputs, then :meth:`finish`."""

    #: a function tool's name → its namespace (tools read from a ``namespace`` tool)
    namespaces: Mapping[str, str] = MappingProxyType({})

    def __init__(
        self,
        make_id: Callable[[str], str] = new_id,
        stop: Sequence[str] = (),
        held: str = "",
    ) -> None:
        self._make_id = make_id
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item being written, if any
        #: stop sequences: the output ends before the first one the text contains
        self.stop = tuple(s for s in stop if s)
        #: text generated but not emitted yet, because a stop sequence may begin with it
        #: (a snapshot keeps it, so a resumed task holds the same text back)
        self.held = held
        #: a stop sequence was generated: nothing more is output
        self.stopped = False
        #: which one (the ``output_text.done`` event notes it, for APIs that report it)
        self.stop_sequence: str | None = None

    # -- feeding ---------------------------------------------------------------------------
    def feed(self, output: EngineOutput) -> list[Event]:
        """The events for one engine output."""
        if isinstance(output, TextDelta):
            return self._text(output)
        if isinstance(output, CallStart):
            return [*self._close("completed"), *self._open_call(output)]
        if isinstance(output, ArgumentsDelta):
            return self._arguments(output.delta)
        return self._close("completed")

    def finish(self, status: ItemStatus = "completed") -> list[Event]:
        """Close what is open (``incomplete`` when a token limit stopped it), after the
        text held back for a stop sequence that never came. A finished response always
        has an item: an empty message when the model said nothing."""
        out: list[Event] = []
        if self.held:
            text, self.held = self.held, ""
            out += self._emit(text, ())
        if not self.items:
            return [*out, *self._open_message(), *self._close(status)]
        return [*out, *self._close(status)]

    def final_items(self, status: ItemStatus = "incomplete") -> list[dict[str, Any]]:
        """The output as it stands, items still open marked ``status`` (a cancel or a
        failure stopped them)."""
        out = copy.deepcopy(self.items)
        for item in out:
            if item["status"] == "in_progress":
                item["status"] = status
        return out

    @property
    def text(self) -> str:
        """All output text so far."""
        return "".join(
            part["text"]
            for item in self.items
            if item["type"] == "message"
            for part in item["content"]
        )

    # -- items -----------------------------------------------------------------------------
    def _index(self) -> int:
        return len(self.items) - 1

    def _open_message(self) -> list[Event]:
        item: dict[str, Any] = {
            "type": "message",
            "id": self._make_id("msg"),
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        self.items.append(item)
        self._open = item
        index = self._index()
        part = text_part()
        item["content"].append(copy.deepcopy(part))
        return [
            {"type": ev.OUTPUT_ITEM_ADDED, "output_index": index, "item": _added(item)},
            {
                "type": ev.CONTENT_PART_ADDED,
                "item_id": item["id"],
                "output_index": index,
                "content_index": 0,
                "part": part,
            },
        ]

    def _text(self, delta: TextDelta) -> list[Event]:
        if self.stopped:
            return []
        if not self.stop:
            return self._emit(delta.text, delta.logprobs)
        text = self.held + delta.text
        found = [(i, s) for s in self.stop if (i := text.find(s)) >= 0]
        if found:
            cut, self.stop_sequence = min(found, key=lambda hit: hit[0])
            self.stopped, self.held = True, ""
            text = text[:cut]
        else:
            keep = self._stop_prefix(text)
            text, self.held = text[: len(text) - keep], text[len(text) - keep :]
        return self._emit(text, delta.logprobs) if text else []

    def _stop_prefix(self, text: str) -> int:
        """The length of the longest end of ``text`` a stop sequence starts with."""
        for size in range(min(len(text), max(map(len, self.stop)) - 1), 0, -1):
            if any(s.startswith(text[-size:]) for s in self.stop):
                return size
        return 0

    def _emit(self, text: str, logprobs: Sequence[dict[str, Any]]) -> list[Event]:
        out: list[Event] = []
        if self._open is None or self._open["type"] != "message":
            out += self._close("completed")
            out += self._open_message()
        item = self._open
        assert item is not None
        part = item["content"][-1]
        part["text"] += text
        part["logprobs"].extend(logprobs)
        out.append(
            {
                "type": ev.OUTPUT_TEXT_DELTA,
                "item_id": item["id"],
                "output_index": self._index(),
                "content_index": len(item["content"]) - 1,
                "delta": text,
                "logprobs": list(logprobs),
            }
        )
        return out

    def _open_call(self, start: CallStart) -> list[Event]:
        item: dict[str, Any] = {
            "type": "function_call",
            "id": self._make_id("fc"),
            "call_id": start.call_id or self._make_id("call"),
            "name": start.name,
            "arguments": "",
            "status": "in_progress",
        }
        if start.name in self.namespaces:  # a namespace's tool (Responses): named so again
            item["namespace"] = self.namespaces[start.name]
        self.items.append(item)
        self._open = item
        return [{"type": ev.OUTPUT_ITEM_ADDED, "output_index": self._index(), "item": _added(item)}]

    def _arguments(self, delta: str) -> list[Event]:
        item = self._open
        if item is None or item["type"] != "function_call":
            raise ValueError("arguments outside a function call")
        item["arguments"] += delta
        return [
            {
                "type": ev.FUNCTION_CALL_ARGUMENTS_DELTA,
                "item_id": item["id"],
                "output_index": self._index(),
                "delta": delta,
            }
        ]

    def _close(self, status: ItemStatus) -> list[Event]:
        item = self._open
        if item is None:
            return []
        self._open = None
        index = self._index()
        out: list[Event] = []
        if item["type"] == "message":
            part = item["content"][-1]
            ref = {"item_id": item["id"], "output_index": index, "content_index": 0}
            done = {
                "type": ev.OUTPUT_TEXT_DONE,
                **ref,
                "text": part["text"],
                "logprobs": copy.deepcopy(part["logprobs"]),
            }
            if self.stop_sequence is not None:  # an LMSP extension: the sequence that ended it
                done["stop_sequence"] = self.stop_sequence
            out += [done, {"type": ev.CONTENT_PART_DONE, **ref, "part": copy.deepcopy(part)}]
        else:
            out.append(
                {
                    "type": ev.FUNCTION_CALL_ARGUMENTS_DONE,
                    "item_id": item["id"],
                    "output_index": index,
                    "name": item["name"],
                    "arguments": item["arguments"],
                }
            )
        item["status"] = status
        out.append(
            {"type": ev.OUTPUT_ITEM_DONE, "output_index": index, "item": copy.deepcopy(item)}
        )
        return out

    # -- rebuilding from the log -----------------------------------------------------------
    @classmethod
    def replay(
        cls,
        logged: Iterable[Event],
        make_id: Callable[[str], str] = new_id,
        stop: Sequence[str] = (),
        held: str = "",
    ) -> OutputAssembler:
        """The assembler as it was after emitting ``logged`` (other events are skipped),
        holding back ``held`` for its ``stop`` sequences."""
        asm = cls(make_id, stop, held)
        for event in logged:
            asm._apply(event)
        return asm

    def _apply(self, event: Event) -> None:
        kind = event.get("type")
        if kind == ev.OUTPUT_ITEM_ADDED:
            item = copy.deepcopy(event["item"])
            self.items.append(item)
            self._open = item
        elif kind == ev.CONTENT_PART_ADDED and self._open is not None:
            self._open["content"].append(copy.deepcopy(event["part"]))
        elif kind == ev.OUTPUT_TEXT_DELTA and self._open is not None:
            part = self._open["content"][-1]
            part["text"] += event["delta"]
            part["logprobs"].extend(event.get("logprobs") or [])
        elif kind == ev.FUNCTION_CALL_ARGUMENTS_DELTA and self._open is not None:
            self._open["arguments"] += event["delta"]
        elif kind == "response.mcp_call_arguments.delta" and self._open is not None:
            self._open["arguments"] += event["delta"]  # an MCP call's (protocol/mcpcalls.py)
        elif kind == ev.OUTPUT_ITEM_DONE and self.items:
            self.items[event["output_index"]] = copy.deepcopy(event["item"])
            self._open = None


def _added(item: dict[str, Any]) -> dict[str, Any]:
    """The item as ``output_item.added`` shows it: nothing generated yet."""
    shown = copy.deepcopy(item)
    if shown["type"] == "message":
        shown["content"] = []
    return shown


def items_from_events(logged: Iterable[Event]) -> list[dict[str, Any]]:
    """The output items a log describes (open ones ``in_progress``)."""
    return OutputAssembler.replay(logged).items
