"""The output of a task whose tools include MCP servers' (pure).

:class:`McpAssembler` reads generated text as :class:`lmsp.protocol.toolcalls.CallAssembler`
does, but a call of an MCP tool (known by its alias, :class:`lmsp.protocol.mcp.Offered`)
becomes an ``mcp_call`` item, or an ``mcp_approval_request`` when the call waits for an
approval. An ``mcp_call``'s arguments stream as ``response.mcp_call_arguments.delta``;
when they are complete the item stays ``in_progress`` and the assembler logs
``response.mcp_call_arguments.done`` and ``response.mcp_call.in_progress``: the journal
entry written (committed) before the call is sent. Its result comes later
(:meth:`McpAssembler.result`): ``response.mcp_call.completed|failed`` and
``response.output_item.done`` with the output or the error.

It also opens and closes ``mcp_list_tools`` items, and re-emits whole items (a retried
task's journal, :meth:`McpAssembler.whole`). Every state it has follows from the events
it emitted, so :meth:`replay` rebuilds it (a resumed task).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

from lmsp.ids import new_id
from lmsp.protocol import events as ev
from lmsp.protocol import mcp
from lmsp.protocol.assembler import CallStart, Event, ItemStatus
from lmsp.protocol.itemtypes import McpApprovalRequest
from lmsp.protocol.toolcalls import CallAssembler

CALL_TYPES = ("function_call", "mcp_call", "mcp_approval_request")


class McpAssembler(CallAssembler):
    def __init__(
        self,
        offered: dict[str, mcp.Offered] | None = None,
        make_id: Callable[[str], str] = new_id,
        held: str = "",
    ) -> None:
        super().__init__(make_id, (), held)
        self.offered = dict(offered or {})
        #: ids of the ``mcp_call`` items whose ``in_progress`` is logged (sent, or about to be)
        self.sent: set[str] = set()

    # -- calls the model writes ------------------------------------------------------------
    def _in_call(self) -> dict[str, Any] | None:
        item = self._open
        return item if item is not None and item["type"] in CALL_TYPES else None

    def _open_call(self, start: CallStart) -> list[Event]:
        tool = self.offered.get(start.name)
        if tool is None:
            return super()._open_call(start)
        kind = "mcp_approval_request" if tool.approval else "mcp_call"
        item: dict[str, Any] = {
            "type": kind,
            "id": self._make_id("mcpr" if tool.approval else "mcp"),
            "server_label": tool.server_label,
            "name": tool.name,
            "arguments": "",
        }
        if kind == "mcp_call":
            item.update(output=None, error=None, status="in_progress")
        self.items.append(item)
        self._open = item
        return [{"type": ev.OUTPUT_ITEM_ADDED, "output_index": self._index(), "item": item.copy()}]

    def _arguments(self, delta: str) -> list[Event]:
        item = self._open
        if item is None or item["type"] == "function_call":
            return super()._arguments(delta)
        item["arguments"] += delta
        return [
            {
                "type": mcp.MCP_CALL_ARGUMENTS_DELTA,
                "item_id": item["id"],
                "output_index": self._index(),
                "delta": delta,
            }
        ]

    def _close(self, status: ItemStatus) -> list[Event]:
        item = self._open
        if item is None or item["type"] not in ("mcp_call", "mcp_approval_request"):
            return super()._close(status)
        self._open = None
        index = self._index()
        done = {
            "type": mcp.MCP_CALL_ARGUMENTS_DONE,
            "item_id": item["id"],
            "output_index": index,
            "arguments": item["arguments"],
        }
        if item["type"] == "mcp_approval_request":
            return [done, {"type": ev.OUTPUT_ITEM_DONE, "output_index": index, "item": dict(item)}]
        if status != "completed":  # cut off before its arguments were whole: never sent
            item["status"] = "incomplete"
            return [done, {"type": ev.OUTPUT_ITEM_DONE, "output_index": index, "item": dict(item)}]
        self.sent.add(item["id"])
        # the journal: logged (committed) before the call is sent
        return [
            done,
            {"type": mcp.MCP_CALL_IN_PROGRESS, "item_id": item["id"], "output_index": index},
        ]

    # -- the loop's own items ----------------------------------------------------------------
    def pending_call(self) -> dict[str, Any] | None:
        """The last ``mcp_call`` if it has no result yet (its arguments are whole)."""
        if self._open is not None or not self.items:
            return None
        item = self.items[-1]
        if item["type"] == "mcp_call" and item.get("status") == "in_progress":
            return item
        return None

    def approved(self, wanted: McpApprovalRequest) -> dict[str, Any]:
        """The ``mcp_call`` an approved ``mcp_approval_request`` (``wanted``) makes, its
        arguments whole; not in the output yet (:meth:`add_call`, or :meth:`refused`)."""
        return {
            "type": "mcp_call",
            "id": self._make_id("mcp"),
            "server_label": wanted.server_label,
            "name": wanted.name,
            "arguments": wanted.arguments,
            "approval_request_id": wanted.id,
            "output": None,
            "error": None,
            "status": "in_progress",
        }

    def add_call(self, item: dict[str, Any], shown: dict[str, Any] | None = None) -> list[Event]:
        """An ``mcp_call`` whose arguments are whole joins the output: its events up to
        ``response.mcp_call_arguments.done`` (``shown``: the item as its
        ``output_item.added`` shows it; by default as it is). Its journal entry is
        :meth:`send`'s."""
        self.items.append(item)
        index = self._index()
        added = dict(item) if shown is None else shown
        return [
            {"type": ev.OUTPUT_ITEM_ADDED, "output_index": index, "item": added},
            {
                "type": mcp.MCP_CALL_ARGUMENTS_DONE,
                "item_id": item["id"],
                "output_index": index,
                "arguments": item["arguments"],
            },
        ]

    def reopen_list(self) -> dict[str, Any] | None:
        """An ``mcp_list_tools`` item a crash left open, to be listed again: no longer
        the open item (``None`` if there is none)."""
        item = self._open
        if item is None or item["type"] != "mcp_list_tools":
            return None
        self._open = None
        return item

    def send(self, item: dict[str, Any]) -> list[Event]:
        """An ``mcp_call`` (whole arguments) about to be sent: its journal entry."""
        self.sent.add(item["id"])
        index = self.items.index(item)
        return [{"type": mcp.MCP_CALL_IN_PROGRESS, "item_id": item["id"], "output_index": index}]

    def result(
        self, item: dict[str, Any], output: str | None, error: dict[str, Any] | None
    ) -> list[Event]:
        """A call's result: the events that report it (logged with it, in one transaction)."""
        index = self.items.index(item)
        item["output"] = output
        item["error"] = error
        item["status"] = "failed" if error is not None else "completed"
        kind = mcp.MCP_CALL_FAILED if error is not None else mcp.MCP_CALL_COMPLETED
        return [
            {"type": kind, "item_id": item["id"], "output_index": index},
            {"type": ev.OUTPUT_ITEM_DONE, "output_index": index, "item": copy.deepcopy(item)},
        ]

    def open_list(self, label: str) -> tuple[dict[str, Any], list[Event]]:
        """A new ``mcp_list_tools`` item (its tools come with :meth:`close_list`)."""
        out = self._close("completed")
        item = mcp.list_item(self._make_id("mcpl"), label)
        self.items.append(item)
        index = self._index()
        return item, [
            *out,
            {"type": ev.OUTPUT_ITEM_ADDED, "output_index": index, "item": copy.deepcopy(item)},
            {"type": mcp.MCP_LIST_TOOLS_IN_PROGRESS, "item_id": item["id"], "output_index": index},
        ]

    def close_list(
        self, item: dict[str, Any], tools: list[dict[str, Any]] | None, error: str | None
    ) -> list[Event]:
        index = self.items.index(item)
        item["tools"] = tools or []
        if error is not None:
            item["error"] = error
        kind = mcp.MCP_LIST_TOOLS_FAILED if error is not None else mcp.MCP_LIST_TOOLS_COMPLETED
        return [
            {"type": kind, "item_id": item["id"], "output_index": index},
            {"type": ev.OUTPUT_ITEM_DONE, "output_index": index, "item": copy.deepcopy(item)},
        ]

    def whole(self, item: dict[str, Any]) -> list[Event]:
        """A finished item re-emitted as it was (a retried task's journal)."""
        out = self._close("completed")
        item = copy.deepcopy(item)
        self.items.append(item)
        index = self._index()
        added = copy.deepcopy(item)
        if added["type"] == "message":
            added["content"] = []
        return [
            *out,
            {"type": ev.OUTPUT_ITEM_ADDED, "output_index": index, "item": added},
            {"type": ev.OUTPUT_ITEM_DONE, "output_index": index, "item": item},
        ]

    def refused(self, item: dict[str, Any], error: dict[str, Any]) -> list[Event]:
        """A call that is not made (never sent): a whole ``mcp_call`` item, ``failed``
        with ``error``."""
        out = self._close("completed")
        item = {**item, "output": None, "error": error, "status": "failed"}
        self.items.append(item)
        index = self._index()
        return [
            *out,
            {"type": ev.OUTPUT_ITEM_ADDED, "output_index": index, "item": copy.deepcopy(item)},
            {"type": ev.OUTPUT_ITEM_DONE, "output_index": index, "item": copy.deepcopy(item)},
        ]

    def finish(self, status: ItemStatus = "completed") -> list[Event]:
        """The response ends: an ``mcp_call`` still open, or whole but not sent (the
        budget ran out as its arguments closed), ends ``incomplete`` — a finished
        response holds no item ``in_progress``."""
        out: list[Event] = []
        if self._open is not None and self._open["type"] == "mcp_call":
            self.held = ""  # the part of its closing seen so far
            out += self._close("incomplete")
        out += super().finish(status)
        for index, item in enumerate(self.items):
            if item.get("status") == "in_progress":
                item["status"] = "incomplete"
                done = {"type": ev.OUTPUT_ITEM_DONE, "output_index": index}
                out.append({**done, "item": copy.deepcopy(item)})
        return out

    def close_open(self) -> list[Event]:
        """End the turn: text held back is emitted, an open item closed (no empty
        message is made)."""
        out: list[Event] = []
        if self._in_call() is None and self.held.strip():
            text, self.held = self.held, ""
            out += self._emit(text, ())
        self.held = ""
        return [*out, *self._close("completed")]

    # -- rebuilding from the log ---------------------------------------------------------------
    @classmethod
    def rebuild(
        cls,
        logged: Iterable[Event],
        offered: dict[str, mcp.Offered] | None = None,
        held: str = "",
    ) -> McpAssembler:
        asm = cls(offered, held=held)
        for event in logged:
            asm._apply(event)
        return asm

    def _apply(self, event: Event) -> None:
        kind = event.get("type")
        if kind == mcp.MCP_CALL_ARGUMENTS_DELTA and self._open is not None:
            self._open["arguments"] += event["delta"]
        elif kind == mcp.MCP_CALL_ARGUMENTS_DONE:
            if self._open is not None and self._open.get("id") == event["item_id"]:
                self._open = None  # its arguments are whole; its result (if any) follows
        elif kind == mcp.MCP_CALL_IN_PROGRESS:
            self.sent.add(event["item_id"])
            if 0 <= event["output_index"] < len(self.items):
                self._open = None
        elif kind == ev.OUTPUT_ITEM_DONE and self.items:
            self.items[event["output_index"]] = copy.deepcopy(event["item"])
            self._open = None
        else:
            super()._apply(event)
