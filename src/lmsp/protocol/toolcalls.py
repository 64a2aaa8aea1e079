"""Generated text with ``<tool_call>`` segments → text and function-call outputs.

The model writes calls as ``<tool_call>{"name": "NAME", "arguments": ARGS}</tool_call>``
(enforced by the grammar of :mod:`lmsp.constraints.grammar`). :class:`CallAssembler`
reads the generated text as it comes: text outside calls becomes message text, a call
becomes a ``function_call`` item whose arguments stream as they are generated.

Only the names in ``callable`` (the functions the turn's grammar lets the model call)
make calls: a head naming another tool, or any head when ``callable`` is empty (a turn
offered no tool: ``tool_choice: "none"``, ``max_tool_calls`` reached), stays plain
text. The grammar is what holds a call to its tool's schema; text the model was free to
write (an injected ``<tool_call>`` it repeats) never becomes a call.

All of its state beyond the log is ``held``, the generated text not yet interpreted (a
part of ``<tool_call>`` or of a call's head, or the part of the closing
``}</tool_call>`` seen so far); whether it is inside a call's arguments, and how deep,
follows from the open item of the log. So a snapshot's ``held`` and the log rebuild it
exactly (:meth:`OutputAssembler.replay`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from lmsp.ids import new_id
from lmsp.protocol.assembler import (
    ArgumentsDelta,
    CallEnd,
    CallStart,
    EngineOutput,
    Event,
    ItemStatus,
    OutputAssembler,
    TextDelta,
)

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
CLOSER = "}" + CALL_CLOSE
_FIXED = CALL_OPEN + '{"name": "'
_SEPARATOR = '", "arguments": '
_HEAD = re.compile(re.escape(_FIXED) + r"([A-Za-z0-9_-]{1,64})" + re.escape(_SEPARATOR))
_NAME = re.compile(r"[A-Za-z0-9_-]{0,64}")


def render_call(name: str, arguments: str) -> str:
    """A call as the model writes it."""
    return CALL_OPEN + '{"name": ' + json.dumps(name) + ', "arguments": ' + arguments + CLOSER


def _could_be_head(rest: str) -> bool:
    """Can ``rest`` (which starts with ``<`` and has no whole head) still become one?"""
    if len(rest) <= len(_FIXED):
        return _FIXED.startswith(rest)
    if not rest.startswith(_FIXED):
        return False
    tail = rest[len(_FIXED) :]
    after = tail[_NAME.match(tail).end() :]  # type: ignore[union-attr]
    return len(after) < len(_SEPARATOR) and _SEPARATOR.startswith(after)


def _longest_open_prefix(text: str) -> int:
    """The length of the longest end of ``text`` that ``<tool_call>`` starts with."""
    for size in range(min(len(text), len(CALL_OPEN) - 1), 0, -1):
        if CALL_OPEN.startswith(text[-size:]):
            return size
    return 0


class _Json:
    """Where a JSON value being written stands: nesting depth, inside a string or not."""

    def __init__(self) -> None:
        self.depth = 0
        self.started = False
        self.in_string = False
        self.escaped = False
        self.scalar = False  # a top-level value that is not an object or array

    def feed(self, text: str) -> int:
        """Consume ``text`` up to the end of the value: the number of characters taken."""
        for index, char in enumerate(text):
            if self.done:
                return index
            self._char(char)
        return len(text)

    @property
    def done(self) -> bool:
        return self.started and self.depth == 0 and not self.in_string and not self.scalar

    def _char(self, char: str) -> None:
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif char == "\\":
                self.escaped = True
            elif char == '"':
                self.in_string = False
        elif char == '"':
            self.in_string = True
        elif char in "{[":
            self.depth += 1
        elif char in "}]":
            self.depth -= 1
        if not self.started and not char.isspace():
            self.started = True


class CallAssembler(OutputAssembler):
    """An :class:`OutputAssembler` for output that may contain tool calls (no stop
    sequences: a request with tools has none)."""

    def __init__(
        self,
        make_id: Callable[[str], str] = new_id,
        stop: Sequence[str] = (),
        held: str = "",
        callable_names: Iterable[str] = (),
    ) -> None:
        super().__init__(make_id, (), held)
        #: the names a call may be made to (the turn's grammar's); any other head is text
        self.callable: frozenset[str] = frozenset(callable_names)

    def feed(self, output: EngineOutput) -> list[Event]:
        if isinstance(output, TextDelta):
            return self._generated(output.text)
        return super().feed(output)

    def _between(self, text: str) -> bool:
        """Is ``text`` only white space outside any message (before a call, between
        calls or after them), which makes no item of its own?"""
        return not text.strip() and (self._open is None or self._open["type"] != "message")

    def _in_call(self) -> dict[str, Any] | None:
        item = self._open
        return item if item is not None and item["type"] == "function_call" else None

    def _generated(self, text: str) -> list[Event]:
        buf, self.held = self.held + text, ""
        out: list[Event] = []
        while buf:
            call = self._in_call()
            if call is not None:
                buf = self._arguments_part(call, buf, out)
                continue
            at = buf.find(CALL_OPEN)
            if at < 0:
                keep = _longest_open_prefix(buf)
                text = buf[: len(buf) - keep]
                if self._between(text):
                    self.held = buf  # white space between items: kept until text follows
                    break
                if text:
                    out += self._emit(text, ())
                self.held = buf[len(buf) - keep :]
                break
            if at > 0:
                if not self._between(buf[:at]):
                    out += self._emit(buf[:at], ())
                buf = buf[at:]
            head = _HEAD.match(buf)
            if head is None:
                if _could_be_head(buf):
                    self.held = buf
                    break
                out += self._emit(CALL_OPEN, ())  # not a call after all: plain text
                buf = buf[len(CALL_OPEN) :]
                continue
            if head[1] not in self.callable:  # no call it may make: plain text
                out += self._emit(head[0], ())
                buf = buf[head.end() :]
                continue
            out += super().feed(CallStart(head[1]))
            buf = buf[head.end() :]
        return out

    def _arguments_part(self, call: dict[str, Any], buf: str, out: list[Event]) -> str:
        """Consume the arguments (and then the closing) of the open call from ``buf``;
        what is left."""
        scanner = _Json()
        scanner.feed(call["arguments"])
        if not scanner.done:
            taken = scanner.feed(buf)
            out += super().feed(ArgumentsDelta(buf[:taken]))
            return buf[taken:]
        if buf.startswith(CLOSER):
            out += super().feed(CallEnd())
            return buf[len(CLOSER) :]
        if CLOSER.startswith(buf):
            self.held = buf
            return ""
        out += super().feed(CallEnd())  # not the closing: the call ends, text follows
        return buf

    def finish(self, status: ItemStatus = "completed") -> list[Event]:
        call = self._in_call()
        if call is None:
            rest = self.held.lstrip()
            if rest and rest.startswith("<") and _could_be_head(rest):
                self.held = self.held[: len(self.held) - len(rest)]  # a call cut off: not text
            if self.items and self._between(self.held):
                self.held = ""
            return super().finish(status)
        scanner = _Json()
        scanner.feed(call["arguments"])
        self.held = ""  # the part of the closing seen so far
        return self._close("completed" if scanner.done else status)
