"""The MCP tool loop of a task, with a journal of effects (PROTOCOL.md section 11).

A task whose ``tools`` name MCP servers runs here instead of the runner's single
turn (:meth:`lmsp.runner.runner.Runner._execute` hands it over): one attempt
(:mod:`lmsp.runner.attempt`, which generates each turn, logs and ends it) whose turns
alternate with journaled calls. The loop:

1. lists each server's tools (an ``mcp_list_tools`` item, only ``allowed_tools``; an
   earlier list of the same server in the context is reused: cached for the task);
2. answers the approvals a follow-up carries (``mcp_approval_response``): an approved
   call runs first (an ``mcp_call`` with its ``approval_request_id``), a refused one never;
3. generates a turn, the tools offered with their ``inputSchema`` (the arguments held to
   it by llguidance, as for function tools), at most one call a turn; ``tool_choice``
   ``{"type": "mcp", …}`` forces the first call, later turns are ``auto``. What a turn
   offers, and so what it may call, is :mod:`lmsp.runner.mcp_offer`'s: only text written
   under the grammar becomes a call (``"none"``, or ``max_tool_calls`` reached: free
   text, no call);
4. a call of an MCP tool is journaled and sent, its result fed back, and the loop goes
   on from 3, up to ``max_tool_calls`` calls in all; a function call, a call that needs
   an approval (an ``mcp_approval_request``) or a turn without a call ends the response.

The journal is the task's event log. A call's arguments and
``response.mcp_call.in_progress`` commit **before** it is sent; its result commits with
the events that report it (``response.mcp_call.completed|failed`` and the item's
``output_item.done``). Every write carries the snapshot (``turn``: where this turn's
tokens begin, ``turn_items``: the items before it), so a resumed task continues
exactly where its log ends. When a task starts again (resume after a restart, an
engine crash or a lost node; or a retry, whose fresh attempt first re-emits the
previous attempt's items up to its last journaled call) a call with a logged result is
never sent again; a call logged ``in_progress`` without a result was in flight: it is
sent again only if its tool is annotated ``readOnlyHint`` or ``idempotentHint``, else
its item ends with the error ``interrupted by a restart; not repeated`` and the model
goes on knowing that.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from lmsp import config
from lmsp.constraints.budget import GrammarBudget
from lmsp.engines.base import EngineError, LoadedModel
from lmsp.metrics import Metrics
from lmsp.outbound import mcp_client
from lmsp.protocol import items as input_items
from lmsp.protocol import mcp
from lmsp.protocol.itemtypes import (
    McpApprovalRequest,
    McpApprovalResponse,
    McpCall,
    McpListTools,
    typed,
)
from lmsp.protocol.mcpcalls import McpAssembler
from lmsp.protocol.records import ResponseRecord
from lmsp.protocol.request import PreparedRequest
from lmsp.protocol.tools import mcp_tools
from lmsp.runner import mcp_offer
from lmsp.runner.attempt import Attempt, Stopped, TaskContext
from lmsp.runner.plan import context_of, sampling_of
from lmsp.store import events, journal, mcp_headers
from lmsp.store import tasks as task_store
from lmsp.store.sql import Conn

log = logging.getLogger(__name__)
Item = dict[str, Any]


def applies(request: PreparedRequest) -> bool:
    """Does this request run the MCP loop?"""
    return bool(mcp_tools(request.tools))


# -- metrics --------------------------------------------------------------------------------
class _Counters:
    def __init__(self, metrics: Metrics) -> None:
        self.calls = Counter(
            "lmsp_mcp_calls",
            "MCP requests sent (tools/call and tools/list), by server label and outcome.",
            ["server", "kind", "outcome"],
            registry=metrics.registry,
        )


_counters: weakref.WeakKeyDictionary[Metrics, _Counters] = weakref.WeakKeyDictionary()


def counters(metrics: Metrics) -> _Counters:
    found = _counters.get(metrics)
    if found is None:
        found = _counters[metrics] = _Counters(metrics)
    return found


@dataclass
class Turn:
    """Where the current turn starts: its first token and the items before it."""

    token: int = 0
    items: int = 0


@dataclass
class Loop:
    task: TaskContext
    response: ResponseRecord
    request: PreparedRequest
    model: LoadedModel
    grammars: GrammarBudget | None = None
    settings: config.Settings = field(default_factory=config.from_env)
    turn: Turn = field(default_factory=Turn)

    def __post_init__(self) -> None:
        self.servers = {tool.server_label: tool for tool in mcp_tools(self.request.tools)}
        self.context = context_of(self.request)
        self.attempt = Attempt(
            self.task, self.model, sampling_of(self.request), McpAssembler(), marks=self._marks
        )
        self.headers: dict[str, dict[str, str]] = {}

    @property
    def asm(self) -> McpAssembler:
        return self.attempt.assembler

    def _marks(self) -> dict[str, Any]:
        """What the snapshot says of the turn: where its tokens and items begin."""
        return {"turn": self.turn.token, "turn_items": self.turn.items}

    def _emit(self, batch: list[dict[str, Any]]) -> None:
        self.attempt.pending += batch

    # -- the tools ---------------------------------------------------------------------------
    def _lists(self) -> dict[str, McpListTools]:
        """The latest list of each server: this response's own, else the context's."""
        found: dict[str, McpListTools] = {}
        for item in [*self.context, *typed(self.asm.items)]:
            if isinstance(item, McpListTools) and item.server_label in self.servers:
                found[item.server_label] = item
        return found

    def _annotations(self, label: str, name: str) -> dict[str, Any] | None:
        listed = self._lists().get(label)
        for tool in listed.tools if listed is not None else ():
            if tool.get("name") == name:
                annotations = tool.get("annotations")
                return annotations if isinstance(annotations, dict) else None
        return None

    def offer(self) -> dict[str, mcp.Offered]:
        """The MCP tools the model may be offered, by the alias it calls them by."""
        return mcp_offer.offer(self._lists(), self.servers, self.request, self._budget())

    def _budget(self) -> GrammarBudget:
        if self.grammars is None:
            raise EngineError("engine_error", "MCP tools need the service's compile budget.")
        return self.grammars

    def _server(self, label: str) -> mcp_client.Server:
        url = self.servers[label].server_url
        return mcp_client.Server(
            url,
            self.headers.get(label, {}),
            self.settings.mcp_timeout,
            mcp.host_rules(self.settings.mcp_hosts),
            self.settings.mcp_max_bytes,
        )

    def _wait(self, future: concurrent.futures.Future[Any]) -> Any:
        """The result of an MCP request, or :class:`Stopped` (the request is dropped)."""
        deadline = time.monotonic() + self.settings.mcp_timeout + 5
        while True:
            if self.task.stopping():
                future.cancel()
                raise Stopped
            try:
                return future.result(timeout=0.1)
            except concurrent.futures.TimeoutError:
                if time.monotonic() > deadline:
                    future.cancel()
                    raise mcp_client.McpFailure(
                        mcp.error_of("mcp_protocol_error", "The MCP request did not end.", -32001)
                    ) from None

    def list_server(self, label: str, item: Item | None = None) -> None:
        """List one server's tools (``item``: a list left open by a crash, listed again)."""
        if item is None:
            item, added = self.asm.open_list(label)
            self._emit(added)
            self.attempt.flush(wait=False)
        metric = counters(self.task.metrics).calls
        try:
            tools = self._wait(mcp_client.list_tools(self._server(label)))
        except mcp_client.McpFailure as exc:
            metric.labels(label, "list", "failed").inc()
            self._emit(self.asm.close_list(item, None, f"Listing the tools failed: {exc}"))
        else:
            definition = self.servers[label]
            shown = [
                mcp.listed_tool(tool)
                for tool in tools
                if mcp.allowed(definition, tool["name"], tool.get("annotations"))
            ]
            if len(shown) > mcp.MAX_TOOLS:
                metric.labels(label, "list", "failed").inc()
                self._emit(self.asm.close_list(item, None, mcp.too_many_tools(len(shown))))
            else:
                metric.labels(label, "list", "ok").inc()
                self._emit(self.asm.close_list(item, shown, None))
        self.between()
        self.attempt.flush(wait=False)

    def call(self, item: Item, journaled: bool) -> None:
        """Send one journaled call and log its result (``journaled``: its
        ``in_progress`` is in the pending events or the log already)."""
        if not journaled:
            self._emit(self.asm.send(item))
        self.attempt.flush(wait=True)  # committed before it is sent
        label = item["server_label"]
        metric = counters(self.task.metrics).calls
        output: str | None
        error: dict[str, Any] | None
        try:
            output, error = self._wait(
                mcp_client.call_tool(
                    self._server(label),
                    item["name"],
                    mcp.arguments_json(item["arguments"]),
                    self.settings.mcp_max_result,
                )
            )
        except mcp_client.McpFailure as exc:
            output, error = None, exc.error
        metric.labels(label, "call", "failed" if error is not None else "ok").inc()
        log.info(
            "task %s: MCP call %s/%s %s",
            self.task.id,
            label,
            item["name"],
            "failed" if error is not None else "completed",
            extra={"task_id": self.task.id, "event": "mcp.call", "server": label},
        )
        self._emit(self.asm.result(item, output, error))
        self.between()
        self.attempt.flush(wait=False)

    def interrupted(self, item: Item) -> None:
        """A call in flight when the task broke off: sent again if its tool says that is
        harmless, else ended with an error (never sent twice)."""
        if mcp.repeatable(self._annotations(item["server_label"], item["name"])):
            self.call(item, journaled=True)
            return
        error = mcp.error_of("mcp_protocol_error", mcp.INTERRUPTED)
        counters(self.task.metrics).calls.labels(item["server_label"], "call", "interrupted").inc()
        self._emit(self.asm.result(item, None, error))
        self.between()
        self.attempt.flush(wait=False)

    # -- starting (fresh, resumed or retried) ------------------------------------------------
    def start(self, conn: Conn, resumed: bool) -> None:
        self.headers = mcp_headers.read(conn, self.response.id)
        snapshot = (task_store.snapshot(conn, self.task.id) if resumed else None) or {}
        self.attempt.tokens = list(snapshot.get("tokens", []))
        self.turn = Turn(int(snapshot.get("turn", 0)), int(snapshot.get("turn_items", 0)))
        self.attempt.input_tokens = int(snapshot.get("input_tokens", 0))
        logged = events.output_events(conn, self.task.id)
        held = str(snapshot.get("held", ""))
        self.attempt.assembler = McpAssembler.rebuild(logged, held=held)
        if not logged:
            self.carry_over(journal.previous_attempt(conn, self.task.id))
        self.asm.offered = self.offer()
        open_list = self.asm.reopen_list()
        if open_list is not None:
            self.list_server(open_list["server_label"], open_list)
        pending = self.asm.pending_call()
        if pending is not None:
            if pending["id"] in self.asm.sent:
                self.interrupted(pending)
            else:
                self.call(pending, journaled=False)

    def carry_over(self, earlier: list[dict[str, Any]]) -> None:
        """A retried task: the previous attempt's items up to its last journaled call
        are re-emitted as they were (no call is sent again); what came after is
        generated again."""
        if not earlier:
            return
        before = McpAssembler.rebuild(earlier)
        last = -1
        for index, item in enumerate(before.items):
            if item["type"] == "mcp_call" and item["id"] in before.sent:
                last = index
            elif item["type"] == "mcp_list_tools" and "error" not in item and item["tools"]:
                last = max(last, index)
        for item in before.items[: last + 1]:
            if item["type"] == "mcp_call" and item.get("status") == "in_progress":
                # in flight: its journal entry comes again, then the policy decides
                self._emit(self.asm.add_call(item, {**item, "arguments": ""}))
                self._emit(self.asm.send(item))
            elif item.get("status") != "incomplete":
                self._emit(self.asm.whole(item))
        self.turn = Turn(0, len(self.asm.items))
        self.attempt.input_tokens = 0
        if self.attempt.pending:
            self.attempt.flush(wait=False)

    def approvals(self) -> None:
        """Answer the approvals of this request's input: run each approved call once —
        if its tool is offered to this response, its arguments match the tool's
        ``inputSchema`` and ``max_tool_calls`` is not reached; else its item fails,
        saying why, and nothing is sent."""
        asked = {item.id: item for item in self.context if isinstance(item, McpApprovalRequest)}
        done = {
            item.approval_request_id
            for item in [*self.context, *typed(self.asm.items)]
            if isinstance(item, McpCall)
        }
        for answer in self.request.input:
            if not isinstance(answer, McpApprovalResponse) or not answer.approve:
                continue
            request_id = answer.approval_request_id
            wanted = asked.get(request_id)
            if wanted is None or request_id in done or wanted.server_label not in self.servers:
                continue
            item = self.asm.approved(wanted)
            made = mcp_offer.calls_in(self.asm.items)
            refusal = mcp_offer.refusal(
                self.request, self.asm.offered, made, wanted, self._budget()
            )
            if refusal is not None:
                error = mcp.error_of("mcp_protocol_error", f"Not run: {refusal}.", -32602)
                self._emit(self.asm.refused(item, error))
                self.between()
                continue
            self._emit(self.asm.add_call(item))
            self.call(item, journaled=False)

    # -- turns -------------------------------------------------------------------------------
    def calls_made(self) -> int:
        """Calls made before this turn (a resumed turn's grammar is its original one):
        every MCP call, approval request and function call counts."""
        return mcp_offer.calls_in(self.asm.items[: self.turn.items])

    def between(self) -> None:
        """A step between turns is logged: the next turn starts here."""
        self.turn = Turn(len(self.attempt.tokens), len(self.asm.items))

    def generate(self) -> str | None:
        """One turn (or the rest of it, resumed); ``"max_output_tokens"`` if the budget
        ran out."""
        prior = [*self.context, *typed(self.asm.items[: self.turn.items])]
        messages = input_items.render(prior, self.request.instructions)
        tools = mcp_offer.turn_tools(self.request, self.asm.offered, self.calls_made())
        text_grammar, shown = mcp_offer.checked(self._budget(), tools.grammar), tools.shown
        self.asm.callable = tools.names  # what the grammar lets it call; the rest is text
        prompt = (
            self.model.prompt_tokens(messages, shown)
            if shown
            else self.model.prompt_tokens(messages)
        )
        done = self.attempt.tokens[self.turn.token :]
        if len(prompt) + len(done) >= self.model.n_ctx:
            raise EngineError(
                "context_length_exceeded",
                f"The prompt has {len(prompt)} tokens with the tool results so far; the"
                f" context holds {self.model.n_ctx}.",
            )
        if not done:
            self.attempt.input_tokens += len(prompt)
        left = self.attempt.room(prompt, done, self.request.max_output_tokens)
        return self.attempt.generate(prompt, done, text_grammar, left)

    # -- the whole task ----------------------------------------------------------------------
    def run(self, conn: Conn, resumed: bool) -> None:
        """The loop, from where the task's log ends to its terminal write (the
        attempt's); what it consumed is charged from the start, however it ends."""
        self.attempt.charge()
        response_id = self.response.id
        self.attempt.conclude(
            lambda: self.turns(conn, resumed),
            also=lambda c: mcp_headers.forget(c, response_id),
        )

    def turns(self, conn: Conn, resumed: bool) -> str | None:
        """The lists, the approved calls, then turns and calls until a turn makes no
        call; why the output is incomplete, if it is."""
        self.start(conn, resumed)
        for label in self.servers:
            if label not in self._lists():
                self.list_server(label)
        self.asm.offered = self.offer()
        self.approvals()
        while True:
            incomplete = self.generate()
            if incomplete is not None:
                return incomplete
            self._emit(self.asm.close_open())
            call = self.asm.pending_call()
            if call is None:
                return None
            self.call(call, journaled=True)


def run(
    task: TaskContext,
    conn: Conn,
    response: ResponseRecord,
    request: PreparedRequest,
    model: LoadedModel,
    resumed: bool,
    grammars: GrammarBudget | None,
) -> None:
    """Run a task's MCP loop (the runner has moved it to ``running``); ``grammars``: the
    compile budget the tools' schemas are checked under."""
    Loop(task, response, request, model, grammars).run(conn, resumed)
