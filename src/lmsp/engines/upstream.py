"""How lmsp talks to a remote upstream that serves a model (llama.cpp's ``llama-server``;
vLLM and SGLang through their OpenAI-compatible completions): what it can do (probed
once, when the model is added), whether it tokenizes as lmsp's own tokenizer does, and
one generation as a stream of token ids.

Two dialects, picked by the probe: ``llama-server`` (its native ``/completion`` with
``return_tokens``, ``/tokenize``, ``/props``, ``/slots``) and ``openai`` (vLLM's and
SGLang's ``/v1/completions`` with ``return_token_ids``, vLLM's ``/tokenize``). A prompt
always goes as token ids (lmsp's tokenizer made them; a text prompt would be
re-tokenized differently) and text is decoded locally from the ids that come back.

A failure of the upstream itself (refused connection, reset, a stream cut short, a
5xx) is :class:`UpstreamLost`: the remote engine treats it as an engine crash. A request
the upstream refuses (a 4xx) is :class:`UpstreamRefused`.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from lmsp.constraints import gbnf
from lmsp.engines.base import DEFAULT_TIER, Sampling
from lmsp.engines.upstream_http import ExchangeLost, direct, post

if TYPE_CHECKING:
    import httpx

#: a streamed body's bytes as they come
Blocks = AsyncIterator[bytes]

#: how long connecting (and each read while nothing streams) may take
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 600.0


class UpstreamLost(Exception):
    """The upstream could not be reached, or broke off: an engine crash."""


class UpstreamRefused(Exception):
    """The upstream answered a request with a 4xx (``message`` says why)."""


@dataclass(frozen=True)
class RemoteSpec:
    """A remote model's upstream, as its record stores it (``models.remote``)."""

    url: str
    upstream_model: str
    api_key_env: str | None = None
    inflight: int = 4
    capabilities: dict[str, Any] = field(default_factory=dict)
    #: more upstreams serving the same model (replicas: least-loaded, prefix affinity)
    replicas: tuple[str, ...] = ()
    #: a ``tokenizer.json`` model's chat template, BOS and EOS (read beside it when the
    #: model was added: :func:`lmsp.engines.hf_tokenizer.read_config`); empty for a GGUF
    tokenizer_config: dict[str, Any] = field(default_factory=dict)
    #: where a tokenizer named by a hub reference was fetched from
    #: (``hf.co/{repo}@{revision}/{file}``); empty for a local file
    tokenizer_origin: str = ""

    @classmethod
    def of(cls, stored: dict[str, Any]) -> RemoteSpec:
        return cls(
            url=str(stored["url"]).rstrip("/"),
            upstream_model=str(stored["upstream_model"]),
            api_key_env=stored.get("api_key_env"),
            inflight=int(stored.get("inflight", 4)),
            capabilities=dict(stored.get("capabilities") or {}),
            replicas=tuple(str(u).rstrip("/") for u in stored.get("replicas") or ()),
            tokenizer_config=dict(stored.get("tokenizer_config") or {}),
            tokenizer_origin=str(stored.get("tokenizer_origin") or ""),
        )

    def stored(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "replicas": list(self.replicas),
            "upstream_model": self.upstream_model,
            "api_key_env": self.api_key_env,
            "inflight": self.inflight,
            "capabilities": self.capabilities,
            **({"tokenizer_config": self.tokenizer_config} if self.tokenizer_config else {}),
            **({"tokenizer_origin": self.tokenizer_origin} if self.tokenizer_origin else {}),
        }

    @property
    def urls(self) -> tuple[str, ...]:
        """Every upstream of the model, the first one first."""
        return (self.url, *self.replicas)

    def at(self, url: str) -> RemoteSpec:
        """The same model at one of its upstreams only."""
        return replace(self, url=url, replicas=())

    @property
    def dialect(self) -> str:
        return str(self.capabilities.get("dialect", "llama-server"))

    def headers(self) -> dict[str, str]:
        """The API key, read from the environment variable the record names."""
        if not self.api_key_env:
            return {}
        key = os.environ.get(self.api_key_env, "")
        return {"Authorization": f"Bearer {key}"} if key else {}

    def timeout(self) -> httpx.Timeout:
        import httpx

        return httpx.Timeout(CONNECT_TIMEOUT, read=READ_TIMEOUT)


@dataclass
class Chunk:
    """What one streamed chunk carried: new token ids, and once the stream ends, why
    (``eos``, ``limit``) and how many prompt tokens the upstream had cached."""

    tokens: list[int]
    predicted: int | None = None  # the upstream's count of tokens generated so far
    content: str = ""  # the text it carried (llama-server: of tokens not streamed too)
    stop: str | None = None
    cached: int | None = None
    logprobs: list[dict[str, Any]] | None = None


def _raise_for(response: httpx.Response, body: bytes) -> None:
    _raise_for_status(response.status_code, body)


def _raise_for_status(status: int, body: bytes) -> None:
    if status < 400:
        return
    text = body.decode("utf-8", errors="replace")[:500]
    try:
        error = json.loads(text).get("error")
        text = error.get("message", text) if isinstance(error, dict) else str(error or text)
    except (ValueError, AttributeError):
        pass
    if status >= 500:
        raise UpstreamLost(f"it answered {status}: {text}")
    raise UpstreamRefused(f"the upstream refused the request ({status}): {text}")


def completion_body(
    spec: RemoteSpec,
    tokens: list[int],
    sampling: Sampling,
    max_tokens: int | None,
    grammar: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """The path and body of a streamed completion after ``tokens``, every sampling value
    explicit (an upstream's own defaults — llama-server's ``top_k`` 40, ``min_p`` 0.05 —
    never apply)."""
    if spec.dialect == "llama-server":
        body: dict[str, Any] = {
            "prompt": tokens,
            "stream": True,
            "return_tokens": True,
            "timings_per_token": True,  # how much of the prompt was cached, at once
            "cache_prompt": True,
            "n_predict": -1 if max_tokens is None else max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": llama_top_k(sampling),
            "min_p": sampling.min_p,
            "typical_p": 1.0,
            "xtc_probability": 0.0,
            "dry_multiplier": 0.0,
            "mirostat": 0,
            "seed": sampling.seed & 0xFFFFFFFF,
            "repeat_penalty": sampling.repeat_penalty,
            # the penalties' history: the whole context (llama-server refuses -1)
            "repeat_last_n": int(spec.capabilities.get("n_ctx") or 4096),
            "presence_penalty": sampling.presence_penalty,
            "frequency_penalty": sampling.frequency_penalty,
            "n_probs": max(1, sampling.top_logprobs) if sampling.logprobs else 0,
        }
        if grammar is not None and spec.capabilities.get("grammar"):
            body["grammar"] = "%llguidance {}\n" + grammar
        elif grammar is not None:  # a JSON Schema, as a GBNF grammar written exactly
            body["grammar"] = gbnf.from_llguidance(grammar)
        return "/completion", body
    body = {
        "model": spec.upstream_model,
        "prompt": tokens,
        "stream": True,
        "return_token_ids": True,
        "max_tokens": max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k > 0 else -1,
        "min_p": sampling.min_p,
        "seed": sampling.seed & 0x7FFFFFFF,
        "repetition_penalty": sampling.repeat_penalty,
        "presence_penalty": sampling.presence_penalty,
        "frequency_penalty": sampling.frequency_penalty,
        "skip_special_tokens": False,
        "stream_options": {"include_usage": True},
    }
    if sampling.logprobs:
        body["logprobs"] = max(1, sampling.top_logprobs)
    if grammar is not None:
        body["structured_outputs"] = {"grammar": grammar}
    priority = upstream_priority(spec, sampling.tier)
    if priority:
        body["priority"] = priority
    return "/v1/completions", body


def llama_top_k(sampling: Sampling) -> int:
    """llama-server's ``top_k`` for ``sampling``: 1 for a greedy draw without logprobs
    (the same argmax, after the penalties, as the whole vocabulary at temperature 0,
    which llama-server would otherwise soften and draw from: a tenth of its CPU a token
    with 8 sequences on a small model, ``bench/run.py --only remote``); the request's
    value otherwise (logprobs list the vocabulary's most likely, not the one kept)."""
    if sampling.temperature <= 0 and not sampling.logprobs:
        return 1
    return sampling.top_k


def upstream_priority(spec: RemoteSpec, tier: int) -> int:
    """The upstream's scheduling priority for a task of ``tier`` (lmsp's claim order: 2
    priority, 1 default, 0 flex), 0 (its default: the field is not sent) where it has
    none. vLLM's ``priority`` (``--scheduling-policy priority``, found when the model was
    added) handles lower values first: ``priority`` -1, ``default`` 0, ``flex`` 1.
    llama-server has no priority: there lmsp's claim order alone decides."""
    if not spec.capabilities.get("priority"):
        return 0
    return DEFAULT_TIER - tier


def parse_chunk(dialect: str, data: dict[str, Any]) -> Chunk:
    """One server-sent event's JSON, in either dialect."""
    if dialect == "llama-server":
        stop = data.get("stop_type") if data.get("stop") else None
        timings = data.get("timings") or {}
        return Chunk(
            tokens=[int(t) for t in data.get("tokens") or []],
            predicted=data.get("tokens_predicted"),
            content=str(data.get("content") or ""),
            stop=stop,
            cached=timings.get("cache_n"),
            logprobs=data.get("completion_probabilities"),
        )
    choices = data.get("choices") or []
    usage = data.get("usage") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if not choices:
        return Chunk(tokens=[], cached=cached)
    choice = choices[0]
    reason = choice.get("finish_reason")
    stop = None if reason is None else ("limit" if reason == "length" else "eos")
    return Chunk(tokens=[int(t) for t in choice.get("token_ids") or []], stop=stop, cached=cached)


def _read_chunk(dialect: str, payload: bytes | str) -> Chunk:
    try:
        return parse_chunk(dialect, json.loads(payload))
    except (ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
        raise UpstreamLost(f"it sent a chunk that cannot be read ({type(exc).__name__})") from exc


async def stream(
    client: httpx.AsyncClient,
    spec: RemoteSpec,
    tokens: list[int],
    sampling: Sampling,
    max_tokens: int | None,
    grammar: str | None = None,
) -> AsyncIterator[Chunk]:
    """The chunks of one streamed completion after ``tokens`` (over plain HTTP on the
    event loop's own socket, :mod:`.upstream_http`; through ``client`` behind TLS or a
    proxy). Raises :class:`UpstreamLost` when the upstream cannot be reached or the
    stream ends before its last chunk, :class:`UpstreamRefused` on a 4xx."""
    path, body = completion_body(spec, tokens, sampling, max_tokens, grammar)
    ended = False
    streamed = _direct(spec, path, body) if direct(spec.url) else _via(client, path, body)
    async with streamed as blocks:  # left (a cancel too): the upstream stops
        async for payload in _payloads(blocks):
            if payload == b"[DONE]":
                ended = True
                break
            chunk = _read_chunk(spec.dialect, payload)
            if chunk.stop is not None:
                ended = True
            yield chunk
            if ended and spec.dialect == "llama-server":
                break
    if not ended:
        raise UpstreamLost("its stream ended before the answer did")


async def _payloads(blocks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The ``data:`` of each line of a server-sent event stream, as lines complete."""
    rest = b""
    async for block in blocks:
        *lines, rest = (rest + block).split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                yield line[5:].strip()
    if rest.startswith(b"data:"):
        yield rest[5:].strip()


@contextlib.asynccontextmanager
async def _direct(spec: RemoteSpec, path: str, body: dict[str, Any]) -> AsyncIterator[Blocks]:
    """The body of a streamed POST on the event loop's own socket (:mod:`.upstream_http`)."""
    data = json.dumps(body, separators=(",", ":")).encode()
    try:
        async with post(
            spec.url, path, data, spec.headers(), CONNECT_TIMEOUT, READ_TIMEOUT
        ) as exchange:
            if exchange.status >= 400:
                _raise_for_status(exchange.status, await exchange.read())
            yield exchange.body()
    except ExchangeLost as exc:
        raise UpstreamLost(str(exc)) from exc


@contextlib.asynccontextmanager
async def _via(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> AsyncIterator[Blocks]:
    """The body of a streamed POST through httpx (TLS, proxies)."""
    import httpx

    try:
        response = await _open(client, path, body)
        try:
            if response.status_code >= 400:
                _raise_for(response, await response.aread())
            yield response.aiter_bytes()
        finally:
            await response.aclose()
    except httpx.TransportError as exc:
        raise UpstreamLost(f"{type(exc).__name__}: {exc}") from exc


async def _open(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> httpx.Response:
    """The streamed response to ``body``, sent again once when the connection it went on
    was closed by the upstream before it answered (a kept-alive connection it had let go:
    nothing of the request was done)."""
    import httpx

    request = client.build_request("POST", path, json=body)
    try:
        return await client.send(request, stream=True)
    except httpx.RemoteProtocolError:
        request = client.build_request("POST", path, json=body)
        return await client.send(request, stream=True)


async def embed(
    client: httpx.AsyncClient, spec: RemoteSpec, inputs: list[list[int]]
) -> list[list[float]]:
    """One vector per input (token ids), in order, through ``/v1/embeddings``."""
    import httpx

    body = {"model": spec.upstream_model, "input": inputs, "encoding_format": "float"}
    try:
        response = await client.post("/v1/embeddings", json=body)
    except httpx.TransportError as exc:
        raise UpstreamLost(f"{type(exc).__name__}: {exc}") from exc
    _raise_for(response, response.content)
    data = sorted(response.json()["data"], key=lambda d: d["index"])
    return [[float(x) for x in d["embedding"]] for d in data]


# -- when the model is added ---------------------------------------------------------------
class Probe:
    """Synchronous requests to an upstream while a model is added (in the API process)."""

    def __init__(self, spec: RemoteSpec, timeout: float = 30.0) -> None:
        import httpx

        self.spec = spec
        self.client = httpx.Client(
            base_url=spec.url,
            headers=spec.headers(),
            timeout=timeout,
            limits=httpx.Limits(max_keepalive_connections=0),  # a few requests, each anew
        )

    def close(self) -> None:
        self.client.close()

    def get(self, path: str) -> httpx.Response:
        import httpx

        try:
            return self.client.get(path)
        except httpx.HTTPError as exc:
            raise UpstreamLost(f"{self.spec.url}{path} could not be reached: {exc}") from exc

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        import httpx

        try:
            return self.client.post(path, json=body)
        except httpx.HTTPError as exc:
            raise UpstreamLost(f"{self.spec.url}{path} could not be reached: {exc}") from exc

    def tokenize(self, dialect: str, text: str) -> list[int]:
        """The upstream's tokens of ``text`` as a raw prompt (special tokens read as such,
        a BOS token where the model asks for one)."""
        if dialect == "llama-server":
            body: dict[str, Any] = {"content": text, "add_special": True, "parse_special": True}
        else:
            body = {"model": self.spec.upstream_model, "prompt": text, "add_special_tokens": True}
        response = self.post("/tokenize", body)
        _raise_for(response, response.content)
        return [int(t) for t in response.json()["tokens"]]

    def complete(self, dialect: str, tokens: list[int], **extra: Any) -> httpx.Response:
        """A short greedy completion after ``tokens`` (not streamed)."""
        greedy = Sampling(temperature=0.0)
        path, body = completion_body(self.spec, tokens, greedy, extra.pop("n", 8))
        body["stream"] = False
        body.pop("stream_options", None)
        body.update(extra)
        return self.post(path, body)


def _completion_ids(dialect: str, response: httpx.Response) -> list[int] | None:
    if response.status_code != 200:
        return None
    data = response.json()
    if dialect == "llama-server":
        found = data.get("tokens")
    else:
        found = ((data.get("choices") or [{}])[0]).get("token_ids")
    return None if found is None else [int(t) for t in found]


def probe(
    spec: RemoteSpec, sample: list[int], check: Callable[[Probe, str], None]
) -> dict[str, Any]:
    """What the upstream can do (the capabilities stored with the model): its dialect,
    context, slots, whether it takes token-id prompts and streams ids back, runs
    llguidance grammars, gives logprobs and embeddings, and answers the same greedy
    tokens twice (determinism). ``sample``: a short prompt's tokens to try; ``check``
    compares tokenizers once the dialect is known. Raises :class:`UpstreamLost` when it
    cannot be reached and :class:`UpstreamRefused` when it is of no use."""
    upstream = Probe(spec)
    try:
        return _probe(upstream, spec, sample, check)
    except (ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
        raise UpstreamRefused(f"it answers what cannot be read ({type(exc).__name__})") from exc
    finally:
        upstream.close()


def _probe(
    upstream: Probe, spec: RemoteSpec, sample: list[int], check: Callable[[Probe, str], None]
) -> dict[str, Any]:
    found = _limits(upstream, spec)
    dialect = found["dialect"]
    upstream.spec = replace(spec, capabilities=found)  # its requests in its dialect
    check(upstream, dialect)
    first = _completion_ids(dialect, upstream.complete(dialect, sample, n=16))
    if not first:
        raise UpstreamRefused("it does not take a prompt as token ids")
    found["token_ids"] = True
    streamed = _streamed_ids(upstream, sample)  # (a token inside a character may be missing)
    found["streamed_ids"] = bool(streamed) and set(streamed) <= set(first)
    if not found["streamed_ids"]:
        raise UpstreamRefused("it does not stream the ids of the tokens it generates")
    again = _completion_ids(dialect, upstream.complete(dialect, sample, n=16))
    found["deterministic"] = again == first
    grammar = upstream.complete(dialect, sample, n=1, **_grammar_probe(dialect))
    found["grammar"] = grammar.status_code == 200
    found["gbnf"] = dialect == "llama-server" and _gbnf_probe(upstream, sample)
    found["logprobs"] = dialect == "llama-server" or _logprobs_probe(upstream, sample)
    # vLLM's priority: accepted only when it schedules by priority (else a 400)
    if found.get("server") == "vllm":
        found["priority"] = upstream.complete(dialect, sample, n=1, priority=1).status_code == 200
    emb = upstream.post("/v1/embeddings", {"model": spec.upstream_model, "input": [sample[:8]]})
    found["embeddings"] = emb.status_code == 200
    return found


def _limits(upstream: Probe, spec: RemoteSpec) -> dict[str, Any]:
    """The dialect, one sequence's context and the number of slots."""
    props = upstream.get("/props")
    if props.status_code == 200 and "n_ctx" in props.text:
        info = props.json()
        settings = info.get("default_generation_settings") or {}
        return {
            "dialect": "llama-server",
            "n_ctx": int(settings.get("n_ctx") or 0),
            "slots": int(info.get("total_slots") or 0),
            "priority": False,
        }
    listed = upstream.get("/v1/models")
    _raise_for(listed, listed.content)
    entry = next(
        (m for m in listed.json().get("data", []) if m.get("id") == spec.upstream_model), None
    )
    if entry is None:
        raise UpstreamRefused(f"it serves no model {spec.upstream_model!r}")
    n_ctx = int(entry.get("max_model_len") or 0)
    server = str(entry.get("owned_by") or "")
    return {"dialect": "openai", "server": server, "n_ctx": n_ctx, "slots": 0, "priority": False}


def _streamed_ids(upstream: Probe, sample: list[int]) -> list[int]:
    """The ids of a streamed 4-token greedy completion, as :func:`stream` reads them."""
    import httpx

    spec = upstream.spec
    path, body = completion_body(spec, sample, Sampling(temperature=0.0), 4)
    found: list[int] = []
    try:
        with upstream.client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                return []
            for line in response.iter_lines():
                payload = line[5:].strip() if line.startswith("data:") else ""
                if payload and payload != "[DONE]":
                    found += _read_chunk(spec.dialect, payload).tokens
    except httpx.HTTPError as exc:
        raise UpstreamLost(f"{spec.url}{path} broke off: {exc}") from exc
    return found


def _grammar_probe(dialect: str) -> dict[str, Any]:
    lark = 'start: "a"'
    if dialect == "llama-server":
        return {"grammar": "%llguidance {}\n" + lark}
    return {"structured_outputs": {"grammar": lark}}


def _gbnf_probe(upstream: Probe, sample: list[int]) -> bool:
    """Whether llama-server holds a completion to a GBNF grammar (``root ::= "a"``)."""
    answer = upstream.complete("llama-server", sample, n=1, grammar='root ::= "a"')
    return answer.status_code == 200 and answer.json().get("content") == "a"


def _logprobs_probe(upstream: Probe, sample: list[int]) -> bool:
    return upstream.complete("openai", sample, n=1, logprobs=1).status_code == 200
