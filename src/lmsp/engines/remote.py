"""The remote engine: a model served by an upstream (llama-server, vLLM, SGLang) behind
the same engine protocol as a model lmsp runs itself.

The API process sees an ordinary engine (:class:`~lmsp.engines.client.EngineClient`):
an engine process is spawned for the model, says :class:`~lmsp.engines.protocol.Ready`
and answers :class:`~lmsp.engines.protocol.Submit` with the pieces of each sequence.
Here a ``Submit`` is a streamed completion of the upstream with the prompt (and a
resume's tokens) as token ids, at most ``inflight`` at once; a ``Cancel`` closes that
stream (the upstream stops generating and frees its slot); an ``Embed`` is a
``/v1/embeddings`` request. Text is decoded here from the ids, with the model's own
tokenizer (the record's blob: a GGUF read without its weights, or a ``tokenizer.json``).
A model may have several upstream replicas: a sequence goes to the one its prompt's
start hashes to (its prefix is cached there) unless that one is busier than the
least-loaded (:meth:`RemoteBackend.route`); one that did not answer when the engine
started is asked again every few seconds and readmitted (:meth:`RemoteBackend._readmit`).

An upstream that breaks off (refused, reset, killed mid-stream) is an engine crash:
every sequence still open is told so (``engine_crashed``, naming the upstream) after
the pieces it had, and the engine process exits (status :data:`UPSTREAM_LOST`), so the
model host counts the crash, starts the engine again (which waits for the upstream to
answer again, backing off) and marks the model failed after a crash loop; each task
follows its ``on_restart`` policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmsp.engines import protocol as wire
from lmsp.engines import upstream
from lmsp.engines.base import EngineError, LoadOptions, Piece, Utf8Stream
from lmsp.engines.client import UPSTREAM_LOST
from lmsp.engines.hf_tokenizer import JsonTokenizer, is_gguf
from lmsp.engines.llama_cpp import LlamaTokenizer
from lmsp.engines.upstream import RemoteSpec, UpstreamLost, UpstreamRefused

if TYPE_CHECKING:
    import httpx
    import numpy as np
    import numpy.typing as npt

log = logging.getLogger("lmsp.engine")

#: how long a (re)started remote engine waits for its upstream to answer, backing off
RECONNECT_FOR = 120.0
#: the prompt tokens whose hash picks a replica (the start an agent's turns share)
AFFINITY_TOKENS = 32
#: how many more sequences than the least-loaded replica the prefix's own may have
#: before a sequence goes to the least-loaded one instead
AFFINITY_SLACK = 1
#: seconds between two looks at the replicas that did not answer when the engine started
REPROBE = 5.0


def spec_of(options: LoadOptions | None) -> RemoteSpec:
    stored = None if options is None else options.remote
    if not stored:
        raise EngineError("model_load_failed", "This model names no upstream.")
    return RemoteSpec.of(stored)


class RemoteTokenizer(LlamaTokenizer):
    """The model's tokenizer (its GGUF's vocabulary), with the upstream's context."""

    def __init__(self, path: Path, spec: RemoteSpec) -> None:
        super().__init__(path, 0)
        self.n_ctx = int(spec.capabilities.get("n_ctx") or 0) or self.n_ctx
        import llama_cpp

        self.eog = {t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self.vocab, t)}
        self.eog |= self.stop_ids


def remote_tokenizer(path: Path, spec: RemoteSpec) -> RemoteTokenizer | JsonTokenizer:
    """The model's tokenizer from its blob: a GGUF's vocabulary, or a ``tokenizer.json``
    (:mod:`lmsp.engines.hf_tokenizer`) with the configuration its record keeps."""
    if is_gguf(path):
        return RemoteTokenizer(path, spec)
    tokenizer = JsonTokenizer(path, spec.tokenizer_config)
    tokenizer.n_ctx = int(spec.capabilities.get("n_ctx") or 0)
    return tokenizer


def wait_for(spec: RemoteSpec, patience: float = RECONNECT_FOR) -> list[str]:
    """The model's upstreams that answer ``/health`` (or ``/v1/models``) with a 200, once
    one does: tried again, backing off from 0.1 s to 5 s; :class:`EngineError`
    ``model_load_failed`` when none has after ``patience``."""
    path = health_path(spec)
    deadline = time.monotonic() + patience
    pause = 0.1
    while True:
        live = [url for url in spec.urls if _answers(url + path, spec.headers())]
        if live:
            return live
        if time.monotonic() + pause > deadline:
            raise EngineError(
                "model_load_failed", f"The upstream {spec.url} did not answer in {patience:.0f} s."
            )
        time.sleep(pause)
        pause = min(5.0, pause * 2)


def health_path(spec: RemoteSpec) -> str:
    """What an upstream answers ``200`` to when it serves: llama-server's ``/health``
    (``503`` while it loads), else ``/v1/models``."""
    return "/health" if spec.dialect == "llama-server" else "/v1/models"


def _answers(url: str, headers: dict[str, str]) -> bool:
    import httpx

    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url, headers=headers, timeout=5.0).status_code == 200
    return False


def affinity(prompt: list[int], urls: tuple[str, ...]) -> str:
    """The upstream a prompt's prefix belongs to: the first :data:`AFFINITY_TOKENS`
    tokens hashed (the same on every node and after a restart), so an agent's turns,
    which share their start, land where that prefix is cached."""
    head = ",".join(str(t) for t in prompt[:AFFINITY_TOKENS]).encode()
    number = int.from_bytes(hashlib.sha256(head).digest()[:8], "big")
    return urls[number % len(urls)]


class RemoteBackend:
    """A remote model in its engine process: it serves the channel itself
    (:meth:`serve`), one asyncio task per sequence."""

    max_step_tokens = 0

    def __init__(self, path: Path, spec: RemoteSpec, live: list[str] | None = None) -> None:
        self.spec = spec
        self.live = live or [spec.url]  # the upstreams that answered when it started
        self.load = {url: 0 for url in self.live}  # sequences on each, waiting ones too
        self.tokenizer = remote_tokenizer(path, spec)
        self.n_ctx = self.tokenizer.n_ctx
        self.sequences = max(1, spec.inflight)
        self.streams = 0  # sequences streamed
        self.cancelled = 0
        self.lost = 0
        self.refilled = 0  # chunks whose unstreamed tokens were re-tokenized here
        self._channel: wire.Channel | None = None
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._gate: asyncio.Semaphore | None = None
        self._outbox: list[wire.FromEngine] = []  # sent at the end of the loop's turn (_flush)

    def memory_bytes(self) -> int:
        return 0  # the weights live on the upstream

    def close(self) -> None:
        self.tokenizer.close()

    # -- the loop ------------------------------------------------------------------------
    def serve(self, channel: wire.Channel, alive: Callable[[], bool]) -> None:
        """Serve ``channel`` until :class:`Shutdown` or the API process is gone."""
        self._channel = channel
        logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line a request
        asyncio.run(self._serve(channel, alive))

    async def _serve(self, channel: wire.Channel, alive: Callable[[], bool]) -> None:
        import httpx

        self._gate = asyncio.Semaphore(self.sequences)
        headers = self.spec.headers()
        limits = httpx.Limits(max_connections=self.sequences + 4)
        async with contextlib.AsyncExitStack() as stack:
            clients = {  # every replica's, those to readmit too (a client connects lazily)
                url: await stack.enter_async_context(
                    httpx.AsyncClient(
                        base_url=url, headers=headers, timeout=self.spec.timeout(), limits=limits
                    )
                )
                for url in self.spec.urls
            }
            readmit = asyncio.get_running_loop().create_task(self._readmit(clients))
            await self._listen(channel, alive, clients)
            readmit.cancel()
            for task in list(self._tasks.values()):
                task.cancel()
            await asyncio.gather(readmit, *self._tasks.values(), return_exceptions=True)
            self._flush()

    async def _readmit(self, clients: dict[str, httpx.AsyncClient]) -> None:
        """Every :data:`REPROBE` seconds, ask the replicas that did not answer when the
        engine started again (:func:`health_path`); one that answers now takes sequences
        from then on, beside the others."""
        import httpx

        path = health_path(self.spec)
        while len(self.live) < len(self.spec.urls):
            await asyncio.sleep(REPROBE)
            for url in self.spec.urls:
                if url in self.live:
                    continue
                with contextlib.suppress(httpx.HTTPError):
                    if (await clients[url].get(path, timeout=5.0)).status_code == 200:
                        self.load[url] = 0
                        self.live.append(url)
                        log.info("remote engine: the upstream %s answers again", url)

    async def _listen(
        self,
        channel: wire.Channel,
        alive: Callable[[], bool],
        clients: dict[str, httpx.AsyncClient],
    ) -> None:
        """Handle the API process's messages as they come, on this event loop (the
        pipe's descriptor is watched by it: a ``Submit`` goes upstream without a hand-over
        between threads), until :class:`Shutdown`, the channel's end, or the API process
        is gone (looked at every half second)."""
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()

        def end() -> None:
            if not ended.done():
                ended.set_result(None)

        def readable() -> None:
            try:
                while not ended.done() and channel.poll(0):
                    frame = channel.recv()
                    for message in frame if isinstance(frame, list) else [frame]:
                        if isinstance(message, wire.Shutdown):
                            end()
                            break
                        self._handle(clients, message)
            except (EOFError, OSError):
                end()

        async def watch() -> None:
            while alive():
                await asyncio.sleep(0.5)
            end()

        fd = channel.fileno()
        loop.add_reader(fd, readable)
        watcher = loop.create_task(watch())
        try:
            await ended
        finally:
            loop.remove_reader(fd)
            watcher.cancel()

    def route(self, prompt: list[int]) -> str:
        """The upstream a sequence goes to: its prefix's (:func:`affinity`) unless that
        one has more than :data:`AFFINITY_SLACK` sequences over the least-loaded one."""
        least = min(self.live, key=lambda url: (self.load[url], self.live.index(url)))
        preferred = affinity(prompt, self.spec.urls)
        if preferred in self.load and self.load[preferred] <= self.load[least] + AFFINITY_SLACK:
            return preferred
        return least

    def _handle(self, clients: dict[str, httpx.AsyncClient], message: Any) -> None:
        if isinstance(message, wire.Submit):
            url = self.route(message.prompt)
            self._start(message.id, self._generate(clients[url], url, message), url)
        elif isinstance(message, wire.Embed):
            url = min(self.live, key=lambda u: self.load[u])
            self._start(message.id, self._embed(clients[url], url, message), url)
        elif isinstance(message, wire.Cancel):
            task = self._tasks.get(message.id)
            if task is not None:
                task.cancel()  # closes its stream: the upstream stops and frees the slot
        elif isinstance(message, wire.Stats):
            figures = {
                "active": len(self._tasks),
                "streams": self.streams,
                "cancelled": self.cancelled,
                "refilled": self.refilled,
                "upstreams": dict(self.load),
            }
            self._send(wire.StatsReply(message.id, figures))
        else:
            log.warning("remote engine: an unknown message %s was ignored", type(message).__name__)

    def _start(self, sid: int, work: Any, url: str) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks[sid] = task
        self.load[url] += 1

        def ended(_: Any) -> None:
            self._tasks.pop(sid, None)
            self.load[url] -= 1

        task.add_done_callback(ended)

    def _send(self, message: wire.FromEngine) -> None:
        """Queue ``message`` for the API process: what every sequence has to say by the
        end of this turn of the event loop goes in one frame (as a local engine sends a
        step's tokens), so 8 streams cost one pipe write a round, not eight."""
        self._outbox.append(message)
        if len(self._outbox) == 1:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        assert self._channel is not None
        messages, self._outbox = self._outbox, []
        if not messages:
            return
        try:
            self._channel.send(wire.pack(messages))
        except (OSError, ValueError):
            os._exit(0)  # the API process is gone: nothing here is worth finishing

    # -- one sequence --------------------------------------------------------------------
    async def _generate(self, client: httpx.AsyncClient, url: str, message: wire.Submit) -> None:
        assert self._gate is not None
        if message.grammar is not None and message.resume:
            # an upstream's grammar starts at the start of what it generates: fed a
            # resume's tokens as prompt it would constrain the rest as a whole answer
            why = "A constrained answer cannot be continued mid-grammar on a remote upstream."
            self._send(wire.Error(message.id, "engine_error", why))
            return
        try:
            async with self._gate:
                self.streams += 1
                reason = await self._pieces(client, url, message)
        except asyncio.CancelledError:
            self.cancelled += 1
            self._send(wire.Done(message.id, wire.CANCELLED))
            return
        except (UpstreamRefused, UpstreamLost) as exc:
            self._failed(message.id, url, exc, "engine_error")
            return
        except Exception as exc:  # a bug here: this sequence fails, the engine goes on
            log.exception("remote engine: a sequence failed")
            self._send(
                wire.Error(message.id, "engine_error", f"The engine failed: {type(exc).__name__}.")
            )
            return
        self._send(wire.Done(message.id, reason))

    async def _pieces(self, client: httpx.AsyncClient, url: str, message: wire.Submit) -> str:
        """Stream one completion, sending its pieces as they come; why it ended."""
        tokenizer = self.tokenizer
        decoder = Utf8Stream()
        if message.resume:  # hold back the bytes of a character the snapshot left open
            decoder.feed(b"".join(tokenizer.piece(t) for t in message.resume))
        first = True
        seen = 0  # tokens the upstream generated that this side has accounted for
        context = list(message.prompt) + list(message.resume)
        async for chunk in upstream.stream(
            client,
            self.spec.at(url),
            context,
            message.sampling,
            message.max_tokens,
            message.grammar,
        ):
            tokens = self._filled(chunk, seen)
            seen = seen + len(tokens) if chunk.predicted is None else chunk.predicted
            pieces: list[Piece] = []
            for i, token in enumerate(tokens):
                if not 0 <= token < tokenizer.n_vocab:  # never given to llama.cpp
                    raise UpstreamLost(f"it sent token {token}, not in the vocabulary")
                if token in tokenizer.eog:
                    continue
                raw = tokenizer.piece(token)
                entry = None
                if message.sampling.logprobs:
                    top = message.sampling.top_logprobs
                    entry = _logprob(tokenizer.piece, chunk.logprobs, i, token, top)
                pieces.append(Piece(token, decoder.feed(raw), entry))
            if pieces or first:
                cached = (chunk.cached or 0) if first else None
                self._send(wire.Tokens(message.id, pieces, cached))
                first = False
            if chunk.stop is not None:
                return wire.LENGTH if chunk.stop == "limit" else wire.STOP
        return wire.STOP

    def _filled(self, chunk: upstream.Chunk, seen: int) -> list[int]:
        """The chunk's tokens, with those llama-server generated but did not stream (it
        streams no token that leaves a UTF-8 character incomplete; its count says how
        many there were): then the chunk's text, re-tokenized here, stands for them all
        — the same text, its ids possibly segmented otherwise."""
        tokens = chunk.tokens
        missing = 0 if chunk.predicted is None else chunk.predicted - seen - len(tokens)
        if missing <= 0 or not chunk.content:
            return tokens
        data = chunk.content.encode("utf-8")
        tokenizer = self.tokenizer
        ids: list[int] = tokenizer.llm.tokenize(data, add_bos=False, special=False)
        if b"".join(tokenizer.piece(t) for t in ids) != data:
            return tokens
        self.refilled += 1
        return ids

    def _failed(
        self, sid: int, url: str, exc: UpstreamRefused | UpstreamLost, refused: str
    ) -> None:
        """An upstream call of sequence ``sid`` failed: a refusal fails that sequence
        (``refused``: its error code), a lost upstream the engine (:meth:`_lost`)."""
        if isinstance(exc, UpstreamLost):
            self._lost(sid, url, str(exc))
        else:
            self._send(wire.Error(sid, refused, str(exc)))

    def _lost(self, sid: int, url: str, why: str) -> None:
        """An upstream broke off: every open sequence hears it (naming the upstream),
        then the engine exits as a crashed one does (see the module docstring); it
        starts again with the upstreams that answer then."""
        self.lost += 1
        message = f"The upstream {url} of this model broke off ({why})."
        log.warning("remote engine: %s", message)
        for other in [sid, *(t for t in self._tasks if t != sid)]:
            self._send(wire.Error(other, "engine_crashed", message))
        self._flush()  # every piece so far, then these, before the engine goes
        os._exit(UPSTREAM_LOST)

    # -- embeddings ------------------------------------------------------------------------
    async def _embed(self, client: httpx.AsyncClient, url: str, message: wire.Embed) -> None:
        import numpy as np

        try:
            inputs = [list(i) for i in message.inputs]
            rows = await upstream.embed(client, self.spec.at(url), inputs)
        except asyncio.CancelledError:
            self._send(wire.Done(message.id, wire.CANCELLED))
            return
        except (UpstreamRefused, UpstreamLost) as exc:
            self._failed(message.id, url, exc, "model_cannot_embed")
            return
        raw = np.asarray(rows, dtype=np.float64)
        norms = np.linalg.norm(raw, axis=1, keepdims=True)
        vectors: npt.NDArray[np.float32] = (raw / np.where(norms > 0, norms, 1.0)).astype(
            np.float32
        )
        self._send(wire.Embeddings(message.id, vectors))


def _logprob(
    piece: Callable[[int], bytes],
    entries: list[dict[str, Any]] | None,
    index: int,
    token: int,
    top: int,
) -> dict[str, Any] | None:
    """llama-server's ``completion_probabilities`` entry of ``token`` in lmsp's shape:
    each token's text and bytes decoded here (as lmsp's own engine gives them), the
    ``top`` most likely of the upstream's list."""
    if not entries or index >= len(entries):
        return None
    entry = entries[index]

    def shaped(tok: int, logprob: Any) -> dict[str, Any]:
        data = piece(tok)
        text = data.decode("utf-8", errors="replace")
        return {"token": text, "logprob": float(logprob), "bytes": list(data)}

    best = [shaped(int(e["id"]), e["logprob"]) for e in entry.get("top_logprobs", [])[:top]]
    return {**shaped(token, entry["logprob"]), "top_logprobs": best}


class RemoteEngine:
    """The engine kind ``remote`` (see the module docstring)."""

    name = "remote"
    constrains = False  # per model: what its upstream was found able to do (grammar)

    def load(self, path: Path, n_ctx: int, options: LoadOptions | None = None) -> RemoteBackend:
        spec = spec_of(options)
        return RemoteBackend(path, spec, wait_for(spec))

    def tokenizer(
        self, path: Path, n_ctx: int, options: LoadOptions | None = None
    ) -> RemoteTokenizer | JsonTokenizer:
        return remote_tokenizer(path, spec_of(options))

    def context_length(self, path: Path, n_ctx: int, options: LoadOptions | None = None) -> int:
        return int(spec_of(options).capabilities.get("n_ctx") or 0)


def constrains(stored: dict[str, Any] | None) -> bool:
    """Whether a remote model's upstream runs llguidance grammars (probed when added)."""
    return bool(stored and (stored.get("capabilities") or {}).get("grammar"))


def holds_json(stored: dict[str, Any] | None) -> bool:
    """Whether a remote model's upstream runs GBNF grammars (probed when added): JSON
    Schemas that :mod:`lmsp.constraints.gbnf` writes exactly, no tools."""
    return bool(stored and (stored.get("capabilities") or {}).get("gbnf"))
