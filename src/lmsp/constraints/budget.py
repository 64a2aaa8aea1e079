"""A request's grammar compiled once, under a time and size budget, in a worker process.

Why: llguidance's compile time grows faster than the schema (3,000 optional properties
0.4 s, 9,000 3.7 s, 16,000 17 s, and then a Rust panic: the grammar has more symbols
than its parser can number). Compiled on the event loop that froze the service; in a
thread it could not be stopped. So the API hands the grammar text to a
:class:`lmsp.sandbox.Sandbox` worker, which compiles it as the engine will — a matcher
over a byte-level vocabulary (the work depends on the grammar, not on the vocabulary)
— with ``cpu_seconds`` of CPU time; past that the worker is stopped and the request
refused (``schema_too_complex``), nothing written. A grammar longer than ``max_bytes``
is refused before any work.

Outcomes are cached by the digest of the grammar text, so a repeated schema (an agent
sends the same one every turn; an attacker the same bomb) costs nothing, and requests
checking the same grammar at once share one compile.

The runner's threads check what they build themselves (an MCP server's ``inputSchema``s
and the grammar of a loop's turn: :mod:`lmsp.runner.mcp_loop`) with :meth:`GrammarBudget.
check_now`, blocking, under the same budget and cache.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from lmsp.fairgate import Ticket
from lmsp.sandbox import Overrun, Sandbox, WorkerFailed

log = logging.getLogger(__name__)

CACHE_SIZE = 1024
#: what a library's error text must not reach a client with
_INTERNAL = ("panic", "backtrace", ".rs:", "RUST_BACKTRACE")


@dataclass(frozen=True)
class Outcome:
    """``kind``: ``ok``; ``unsupported`` (``schema`` is the index of the schema whose
    keyword cannot be enforced, ``problem`` llguidance's words for it); or
    ``too_complex`` (``limit`` names the budget the compile went past)."""

    kind: str
    schema: int | None = None
    problem: str = ""
    limit: str = ""

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


OK = Outcome("ok")

#: why a compile was refused, by :attr:`Outcome.limit` (:meth:`GrammarBudget.reason`)
LIMITS = {
    "cpu": "compiling them took more than {seconds:g}s of CPU time (LMSP_SCHEMA_CPU_TIME)",
    "wall": "compiling them took too long on this busy machine (LMSP_SCHEMA_CPU_TIME); retry",
    "memory": "compiling them needed more memory than allowed (LMSP_INPUT_MEMORY)",
    "bytes": "they are {size} bytes as JSON; at most {most} are allowed (LMSP_MAX_SCHEMA_BYTES)",
    "engine": "the grammar they make is larger than the constraint engine can hold",
    "depth": "they are nested too deeply",
    "crash": "the constraint engine failed on them",
    "request": (
        "the request's files and schemas together took more than {request:g}s of CPU time"
        " (LMSP_REQUEST_CPU_TIME)"
    ),
    "deadline": (
        "they were not compiled in time (the request's time counts from its arrival:"
        " LMSP_REQUEST_CPU_TIME); the machine is busy, retry later"
    ),
}


def looks_internal(text: str) -> bool:
    """Is ``text`` a library's internals (a panic, a backtrace, source paths)?"""
    lowered = text.lower()
    return any(marker.lower() in lowered for marker in _INTERNAL)


# -- in the worker ------------------------------------------------------------------------
_byte_tokenizer: Any = None


def _tokenizer() -> Any:
    """A 257-token vocabulary (every byte, and an end token): compiling against it
    costs what compiling against a model's vocabulary costs, without the model."""
    global _byte_tokenizer
    if _byte_tokenizer is None:
        from llguidance import LLTokenizer, TokenizerWrapper

        class Bytes:
            eos_token_id = 256
            bos_token_id = None
            tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]
            special_token_ids = [256]

            def __call__(self, text: str | bytes) -> list[int]:
                return list(text.encode() if isinstance(text, str) else text)

        _byte_tokenizer = LLTokenizer(TokenizerWrapper(Bytes()))
    return _byte_tokenizer


def compile_job(grammar: str | None, schemas: str) -> tuple[str, int | None, str]:
    """Run in a worker: validate each of ``schemas`` (a JSON list; the first one
    llguidance cannot enforce is named), then compile ``grammar`` (the output's, built
    from some of them). Returns ``(kind, schema index, problem)`` (see :class:`Outcome`)."""
    from llguidance import LLMatcher

    from lmsp.constraints import grammar as grammars

    for index, schema in enumerate(json.loads(schemas)):
        try:
            problem = LLMatcher.validate_grammar(grammars.schema_grammar(schema))
        except grammars.UnsupportedSchema as exc:
            problem = exc.message
        if problem:
            if looks_internal(problem):
                return ("too_complex", index, problem[:4000])
            return ("unsupported", index, problem)
    if grammar is None:
        return ("ok", None, "")
    matcher = LLMatcher(_tokenizer(), grammar, log_level=0)
    if not matcher.is_error():
        return ("ok", None, "")
    return ("too_complex", None, matcher.get_error()[:4000])


def accepts_job(grammar: str, text: str) -> bool:
    """Run in a worker: does ``grammar`` accept ``text`` whole?"""
    from llguidance import LLMatcher

    matcher = LLMatcher(_tokenizer(), grammar, log_level=0)
    if matcher.is_error():
        return False
    for byte in text.encode():
        if not matcher.consume_token(byte):
            return False
    return bool(matcher.is_accepting())


# -- in the API (and the runner's threads) -------------------------------------------------
class GrammarBudget:
    """Checks grammars in ``sandbox`` workers under ``cpu_seconds`` and ``max_bytes``."""

    def __init__(self, sandbox: Sandbox, *, cpu_seconds: float, max_bytes: int) -> None:
        self.sandbox = sandbox
        self.cpu_seconds = cpu_seconds
        self.max_bytes = max_bytes
        self._done: OrderedDict[str, Outcome] = OrderedDict()
        self._done_lock = threading.Lock()  # the event loop and the runner's threads
        self._pending: dict[str, asyncio.Future[Outcome]] = {}
        self.compiles = 0  # how many grammars were compiled (not answered from the cache)

    def reason(self, outcome: Outcome, request_seconds: float = 0.0) -> str:
        """Why ``outcome`` (``too_complex``) was refused, naming the setting."""
        return LIMITS.get(outcome.limit, LIMITS["crash"]).format(
            seconds=self.cpu_seconds,
            size=outcome.problem,
            most=self.max_bytes,
            request=request_seconds,
        )

    def _lookup(
        self, grammar: str | None, schemas: list[dict[str, Any]]
    ) -> tuple[str, str] | Outcome:
        """The outcome known without a compile (nothing to check, the refusal of the
        schemas' size, a cached outcome), else the cache key and the schemas' compact
        JSON to compile."""
        if not schemas and grammar is None:
            return OK
        try:
            shown = json.dumps(schemas, separators=(",", ":"), ensure_ascii=False).encode()
        except RecursionError:
            return Outcome("too_complex", limit="depth")
        if len(shown) > self.max_bytes:
            return Outcome("too_complex", limit="bytes", problem=str(len(shown)))
        key = hashlib.sha256(shown + b"\0" + (grammar or "").encode()).hexdigest()
        return self._known(key) or (key, shown.decode())

    def _known(self, key: str) -> Outcome | None:
        with self._done_lock:
            known = self._done.get(key)
            if known is not None:
                self._done.move_to_end(key)
            return known

    def _remember(self, key: str, outcome: Outcome) -> None:
        if outcome.limit in ("wall", "crash", "request", "deadline"):
            return  # the machine was busy, the worker broke, the request's budget
        with self._done_lock:
            self._done[key] = outcome
            while len(self._done) > CACHE_SIZE:
                self._done.popitem(last=False)

    def check_now(self, grammar: str | None, schemas: list[dict[str, Any]]) -> Outcome:
        """:meth:`check`, blocking, from a thread that is not the event loop's (the
        runner's: an MCP loop's schemas and turn grammars), under the same budget and
        cache; it waits for a free worker, outside the API's fair queue."""
        found = self._lookup(grammar, schemas)
        if isinstance(found, Outcome):
            return found
        key, shown = found
        self.compiles += 1
        try:
            result = self.sandbox.call(compile_job, grammar, shown, cpu_seconds=self.cpu_seconds)
        except (Overrun, WorkerFailed) as exc:
            outcome = self._outcome(grammar, exc)
        else:
            outcome = self._outcome(grammar, result)
        self._remember(key, outcome)
        return outcome

    def accepts_now(self, grammar: str, text: str) -> bool:
        """Does ``grammar`` accept ``text`` (checked in a worker, under the budget;
        ``False`` past it)? Blocking, as :meth:`check_now`."""
        try:
            return bool(self.sandbox.call(accepts_job, grammar, text, cpu_seconds=self.cpu_seconds))
        except (Overrun, WorkerFailed):
            return False

    async def check(
        self, grammar: str | None, schemas: list[dict[str, Any]], ticket: Ticket | None = None
    ) -> Outcome:
        """The outcome of checking ``schemas`` and compiling ``grammar`` (the output's
        grammar, built from them; ``None`` when the output is free text); a compile is
        charged to ``ticket``, its request's budget (:mod:`lmsp.fairgate`)."""
        found = self._lookup(grammar, schemas)
        if isinstance(found, Outcome):
            return found
        key, shown = found
        waiting = self._pending.get(key)
        if waiting is not None:
            return await asyncio.shield(waiting)
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            outcome = await self._compile(grammar, shown, ticket)
            future.set_result(outcome)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning if none waits
            raise
        finally:
            del self._pending[key]
        self._remember(key, outcome)
        return outcome

    async def _compile(self, grammar: str | None, schemas: str, ticket: Ticket | None) -> Outcome:
        self.compiles += 1
        try:
            result = await self.sandbox.run(
                compile_job, grammar, schemas, cpu_seconds=self.cpu_seconds, ticket=ticket
            )
        except (Overrun, WorkerFailed) as exc:
            return self._outcome(grammar, exc)
        return self._outcome(grammar, result)

    def _outcome(
        self, grammar: str | None, result: tuple[str, int | None, str] | Overrun | WorkerFailed
    ) -> Outcome:
        """The outcome of a compile job: its result, or the sandbox's error."""
        size = len(grammar or "")
        if isinstance(result, Overrun):
            log.warning(
                "a grammar of %d bytes went past its %s limit",
                size,
                result.limit,
                extra={"event": "grammar.over_budget", "limit": result.limit},
            )
            return Outcome("too_complex", limit=result.limit)
        if isinstance(result, WorkerFailed):
            log.warning(
                "compiling a grammar of %d bytes failed: %s",
                size,
                result.detail,
                extra={"event": "grammar.failed"},
            )
            return Outcome("too_complex", limit="crash")
        kind, index, problem = result
        if kind == "too_complex":
            log.info(
                "a grammar of %d bytes did not compile: %s",
                size,
                problem,
                extra={"event": "grammar.failed"},
            )
            return Outcome("too_complex", schema=index, limit="engine")
        return Outcome(kind, index, problem)
