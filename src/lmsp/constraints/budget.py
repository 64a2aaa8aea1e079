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
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
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


# -- in the API ---------------------------------------------------------------------------
class GrammarBudget:
    """Checks grammars in ``sandbox`` workers under ``cpu_seconds`` and ``max_bytes``."""

    def __init__(self, sandbox: Sandbox, *, cpu_seconds: float, max_bytes: int) -> None:
        self.sandbox = sandbox
        self.cpu_seconds = cpu_seconds
        self.max_bytes = max_bytes
        self._done: OrderedDict[str, Outcome] = OrderedDict()
        self._pending: dict[str, asyncio.Future[Outcome]] = {}
        self.compiles = 0  # how many grammars were compiled (not answered from the cache)

    async def check(
        self, grammar: str | None, schemas: list[dict[str, Any]], ticket: Ticket | None = None
    ) -> Outcome:
        """The outcome of checking ``schemas`` and compiling ``grammar`` (the output's
        grammar, built from them; ``None`` when the output is free text); a compile is
        charged to ``ticket``, its request's budget (:mod:`lmsp.fairgate`)."""
        if not schemas and grammar is None:
            return OK
        try:
            shown = json.dumps(schemas, separators=(",", ":"), ensure_ascii=False).encode()
        except RecursionError:
            return Outcome("too_complex", limit="depth")
        if len(shown) > self.max_bytes:
            return Outcome("too_complex", limit="bytes", problem=str(len(shown)))
        key = hashlib.sha256(shown + b"\0" + (grammar or "").encode()).hexdigest()
        known = self._done.get(key)
        if known is not None:
            self._done.move_to_end(key)
            return known
        waiting = self._pending.get(key)
        if waiting is not None:
            return await asyncio.shield(waiting)
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            outcome = await self._compile(grammar, shown.decode(), ticket)
            future.set_result(outcome)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning if none waits
            raise
        finally:
            del self._pending[key]
        if outcome.limit in ("wall", "crash", "request", "deadline"):
            return outcome  # the machine was busy, the worker broke, the request's budget
        self._done[key] = outcome
        while len(self._done) > CACHE_SIZE:
            self._done.popitem(last=False)
        return outcome

    async def _compile(self, grammar: str | None, schemas: str, ticket: Ticket | None) -> Outcome:
        self.compiles += 1
        try:
            kind, index, problem = await self.sandbox.run(
                compile_job, grammar, schemas, cpu_seconds=self.cpu_seconds, ticket=ticket
            )
        except Overrun as exc:
            log.warning(
                "a grammar of %d bytes went past its %s limit",
                len(grammar or ""),
                exc.limit,
                extra={"event": "grammar.over_budget", "limit": exc.limit},
            )
            return Outcome("too_complex", limit=exc.limit)
        except WorkerFailed as exc:
            log.warning(
                "compiling a grammar of %d bytes failed: %s",
                len(grammar or ""),
                exc.detail,
                extra={"event": "grammar.failed"},
            )
            return Outcome("too_complex", limit="crash")
        if kind == "too_complex":
            log.info(
                "a grammar of %d bytes did not compile: %s",
                len(grammar or ""),
                problem,
                extra={"event": "grammar.failed"},
            )
            return Outcome("too_complex", schema=index, limit="engine")
        return Outcome(kind, index, problem)
