"""The MCP tool loop of a task, with a journal of effects (PROTOCOL.md section 11).

A task whose ``tools`` name MCP servers runs here instead of the runner's single
generation (:meth:`lmsp.runner.runner.Runner._execute` hands it over). The loop:

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
import contextlib
import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter

from lmsp import config
from lmsp.constraints.budget import GrammarBudget
from lmsp.engines.base import EngineCrashed, EngineError
from lmsp.metrics import Metrics
from lmsp.outbound import mcp_client
from lmsp.protocol import events as ev
from lmsp.protocol import items as input_items
from lmsp.protocol import mcp
from lmsp.protocol.assembler import TextDelta
from lmsp.protocol.itemtypes import (
    McpApprovalRequest,
    McpApprovalResponse,
    McpCall,
    McpListTools,
    typed,
)
from lmsp.protocol.mcpcalls import McpAssembler
from lmsp.protocol.objects import usage_counts
from lmsp.protocol.request import PreparedRequest
from lmsp.protocol.tools import mcp_tools
from lmsp.runner import mcp_offer
from lmsp.runner.plan import context_of, sampling_of
from lmsp.store import events, journal, mcp_headers
from lmsp.store import tasks as task_store
from lmsp.store.sql import Conn, Row

if TYPE_CHECKING:
    from lmsp.engines.client import EngineClient as LoadedModel
    from lmsp.runner.runner import Runner
    from lmsp.store.models import ModelRecord

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


class Stopped(Exception):
    """The task was cancelled, or the service is shutting down."""


@dataclass
class Turn:
    """Where the current turn starts: its first token and the items before it."""

    token: int = 0
    items: int = 0
    input_tokens: int = 0


@dataclass
class Loop:
    runner: Runner
    task_id: str
    response: Row
    request: PreparedRequest
    model: LoadedModel
    record: ModelRecord
    settings: config.Settings = field(default_factory=config.from_env)
    tokens: list[int] = field(default_factory=list)
    turn: Turn = field(default_factory=Turn)
    pending: list[dict[str, Any]] = field(default_factory=list)
    cached: int = 0

    def __post_init__(self) -> None:
        self.servers = {tool.server_label: tool for tool in mcp_tools(self.request.tools)}
        self.context = context_of(self.request)
        self.sampling = sampling_of(self.request)
        self.asm = McpAssembler()
        self.headers: dict[str, dict[str, str]] = {}
        self.inflight: concurrent.futures.Future[Any] | None = None

    # -- writes ----------------------------------------------------------------------------
    def _snap(self) -> dict[str, Any]:
        return {
            "tokens": list(self.tokens),
            "seed": self.sampling.seed,
            "held": self.asm.held,
            "turn": self.turn.token,
            "turn_items": self.turn.items,
            "input_tokens": self.turn.input_tokens,
        }

    def _job(self, batch: list[dict[str, Any]], snap: dict[str, Any]) -> Any:
        task_id = self.task_id
        return self.runner._fenced(
            task_id, lambda c: task_store.append_output(c, task_id, batch, snap)
        )

    def flush(self, wait: bool) -> None:
        """Log the pending events with the snapshot covering them (``wait``: committed
        when this returns — the journal's rule before a call is sent)."""
        if self.inflight is not None:
            if not self.inflight.result():
                raise Stopped  # the task left `running`: a cancel won
            self.inflight = None
        batch, self.pending = list(self.pending), []
        future = self.runner.db.submit(self._job(batch, self._snap()))
        if wait:
            if not future.result():
                raise Stopped
        else:
            self.inflight = future

    def usage(self) -> dict[str, int]:
        """What the task has consumed so far: every turn's prompt given to the engine,
        every token generated (charged however it ends: :meth:`Runner.spent`)."""
        return usage_counts(self.turn.input_tokens, len(self.tokens), self.cached)

    def _stopping(self) -> bool:
        return self.task_id in self.runner._cancels or self.runner._shutdown.is_set()

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
        if self.runner.grammars is None:
            raise EngineError("engine_error", "MCP tools need the service's compile budget.")
        return self.runner.grammars

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
            if self._stopping():
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
            self.pending += added
            self.flush(wait=False)
        metric = counters(self.runner.metrics).calls
        try:
            tools = self._wait(mcp_client.list_tools(self._server(label)))
        except mcp_client.McpFailure as exc:
            metric.labels(label, "list", "failed").inc()
            self.pending += self.asm.close_list(item, None, f"Listing the tools failed: {exc}")
        else:
            definition = self.servers[label]
            shown = [
                mcp.listed_tool(tool)
                for tool in tools
                if mcp.allowed(definition, tool["name"], tool.get("annotations"))
            ]
            if len(shown) > mcp.MAX_TOOLS:
                metric.labels(label, "list", "failed").inc()
                self.pending += self.asm.close_list(item, None, mcp.too_many_tools(len(shown)))
            else:
                metric.labels(label, "list", "ok").inc()
                self.pending += self.asm.close_list(item, shown, None)
        self.between()
        self.flush(wait=False)

    def call(self, item: Item, journaled: bool) -> None:
        """Send one journaled call and log its result (``journaled``: its
        ``in_progress`` is in the pending events or the log already)."""
        if not journaled:
            self.pending += self.asm.send(item)
        self.flush(wait=True)  # committed before it is sent
        label = item["server_label"]
        metric = counters(self.runner.metrics).calls
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
            self.task_id,
            label,
            item["name"],
            "failed" if error is not None else "completed",
            extra={"task_id": self.task_id, "event": "mcp.call", "server": label},
        )
        self.pending += self.asm.result(item, output, error)
        self.between()
        self.flush(wait=False)

    def interrupted(self, item: Item) -> None:
        """A call in flight when the task broke off: sent again if its tool says that is
        harmless, else ended with an error (never sent twice)."""
        if mcp.repeatable(self._annotations(item["server_label"], item["name"])):
            self.call(item, journaled=True)
            return
        error = mcp.error_of("mcp_protocol_error", mcp.INTERRUPTED)
        counters(self.runner.metrics).calls.labels(
            item["server_label"], "call", "interrupted"
        ).inc()
        self.pending += self.asm.result(item, None, error)
        self.between()
        self.flush(wait=False)

    # -- starting (fresh, resumed or retried) ------------------------------------------------
    def start(self, conn: Conn, resumed: bool) -> None:
        self.headers = mcp_headers.read(conn, self.response["id"])
        snapshot = (task_store.snapshot(conn, self.task_id) if resumed else None) or {}
        self.tokens = list(snapshot.get("tokens", []))
        self.turn = Turn(
            int(snapshot.get("turn", 0)),
            int(snapshot.get("turn_items", 0)),
            int(snapshot.get("input_tokens", 0)),
        )
        logged = events.output_events(conn, self.task_id)
        self.asm = McpAssembler.rebuild(logged, held=str(snapshot.get("held", "")))
        if not logged:
            self.carry_over(journal.previous_attempt(conn, self.task_id))
        self.asm.offered = self.offer()
        open_item = self.asm._open
        if open_item is not None and open_item["type"] == "mcp_list_tools":
            self.asm._open = None
            self.list_server(open_item["server_label"], open_item)
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
                added = {**item, "arguments": ""}
                self.asm.items.append(item)
                index = len(self.asm.items) - 1
                self.asm.sent.add(item["id"])
                self.pending += [
                    {"type": ev.OUTPUT_ITEM_ADDED, "output_index": index, "item": added},
                    {
                        "type": mcp.MCP_CALL_ARGUMENTS_DONE,
                        "item_id": item["id"],
                        "output_index": index,
                        "arguments": item["arguments"],
                    },
                    {
                        "type": mcp.MCP_CALL_IN_PROGRESS,
                        "item_id": item["id"],
                        "output_index": index,
                    },
                ]
            elif item.get("status") != "incomplete":
                self.pending += self.asm.whole(item)
        self.turn = Turn(0, len(self.asm.items), 0)
        if self.pending:
            self.flush(wait=False)

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
            item: Item = {
                "type": "mcp_call",
                "id": self.asm._make_id("mcp"),
                "server_label": wanted.server_label,
                "name": wanted.name,
                "arguments": wanted.arguments,
                "approval_request_id": request_id,
                "output": None,
                "error": None,
                "status": "in_progress",
            }
            made = mcp_offer.calls_in(self.asm.items)
            refusal = mcp_offer.refusal(
                self.request, self.asm.offered, made, wanted, self._budget()
            )
            if refusal is not None:
                error = mcp.error_of("mcp_protocol_error", f"Not run: {refusal}.", -32602)
                self.pending += self.asm.refused(item, error)
                self.between()
                continue
            self.asm.items.append(item)
            index = len(self.asm.items) - 1
            self.pending += [
                {"type": ev.OUTPUT_ITEM_ADDED, "output_index": index, "item": dict(item)},
                {
                    "type": mcp.MCP_CALL_ARGUMENTS_DONE,
                    "item_id": item["id"],
                    "output_index": index,
                    "arguments": item["arguments"],
                },
            ]
            self.call(item, journaled=False)

    # -- turns -------------------------------------------------------------------------------
    def calls_made(self) -> int:
        """Calls made before this turn (a resumed turn's grammar is its original one):
        every MCP call, approval request and function call counts."""
        return mcp_offer.calls_in(self.asm.items[: self.turn.items])

    def between(self) -> None:
        """A step between turns is logged: the next turn starts here."""
        self.turn = Turn(len(self.tokens), len(self.asm.items), self.turn.input_tokens)

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
        done = self.tokens[self.turn.token :]
        if len(prompt) + len(done) >= self.model.n_ctx:
            raise EngineError(
                "context_length_exceeded",
                f"The prompt has {len(prompt)} tokens with the tool results so far; the"
                f" context holds {self.model.n_ctx}.",
            )
        if not done:
            self.turn.input_tokens += len(prompt)
        limit = self.request.max_output_tokens
        budget = self.model.n_ctx - len(prompt) - len(done)
        left = budget if limit is None else min(limit - len(self.tokens), budget)
        if left <= 0:
            return "max_output_tokens"
        runner = self.runner
        runner.metrics.prompt(self.task_id, len(prompt))
        runner.metrics.reading(self.task_id, len(prompt))
        generation = self.model.generate(
            prompt, done, self.sampling, grammar=text_grammar, max_tokens=left
        )
        runner.started(self.task_id, generation)
        last_flush = time.monotonic()
        produced = 0
        try:
            with contextlib.closing(generation):
                for piece in generation:
                    self.tokens.append(piece.token)
                    produced += 1
                    runner.metrics.token(self.task_id)
                    if piece.text:
                        self.pending += self.asm.feed(TextDelta(piece.text))
                    if self._stopping():
                        raise Stopped
                    if produced >= left:
                        return "max_output_tokens"
                    if self.pending and time.monotonic() - last_flush >= runner.flush_interval:
                        self.flush(wait=False)
                        last_flush = time.monotonic()
                self.cached += generation.cached_tokens
        finally:
            runner._live.pop(self.task_id, None)
        return None

    # -- the whole task ----------------------------------------------------------------------
    def run(self, conn: Conn, resumed: bool) -> None:
        self.runner._spent[self.task_id] = self.usage
        try:
            self.start(conn, resumed)
            for label in self.servers:
                if label not in self._lists():
                    self.list_server(label)
            self.asm.offered = self.offer()
            self.approvals()
            incomplete: str | None = None
            while True:
                incomplete = self.generate()
                if incomplete is not None:
                    break
                self.pending += self.asm.close_open()
                call = self.asm.pending_call()
                if call is None:
                    break
                self.call(call, journaled=True)
        except Stopped:
            self._stop()
            return
        except EngineCrashed:
            if self.inflight is not None:
                self.inflight.result()
            if self.pending and self.task_id not in self.runner._cancels:
                self.flush(wait=True)
            raise
        self._finish(incomplete)

    def _stop(self) -> None:
        """Cancelled or shutting down: keep what was generated (shutdown: recovery
        applies the task's policy), or finish the cancel."""
        runner = self.runner
        if self.inflight is not None:
            self.inflight.result()
            self.inflight = None
        if runner._shutdown.is_set() and self.task_id not in runner._cancels:
            if self.pending:
                with contextlib.suppress(Stopped):
                    self.flush(wait=True)
            return
        runner._cancelled(self.task_id)

    def _finish(self, incomplete: str | None) -> None:
        if self.inflight is not None and not self.inflight.result():
            self.runner._cancelled(self.task_id)
            return
        last = list(self.pending)
        snap = {"tokens": list(self.tokens), "seed": self.sampling.seed}
        closing = self.asm.finish("incomplete" if incomplete else "completed")
        output = self.asm.items
        usage = self.usage()
        task_id = self.task_id
        response_id = self.response["id"]

        def finish(c: Conn) -> None:
            if last:
                task_store.append_output(c, task_id, last, snap)
            task_store.settle(c, task_id, closing, output, usage, incomplete)
            mcp_headers.forget(c, response_id)

        self.runner._durably(task_id, finish)


def run(
    runner: Runner,
    task_id: str,
    conn: Conn,
    response: Row,
    request: PreparedRequest,
    model: LoadedModel,
    record: ModelRecord,
    resumed: bool,
) -> None:
    """Run a task's MCP loop (the runner has moved it to ``running``)."""
    Loop(runner, task_id, response, request, model, record).run(conn, resumed)
