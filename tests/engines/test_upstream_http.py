"""A remote model's streamed completion over plain HTTP on the event loop's own socket
(engines/upstream_http.py), against a peer on loopback that answers as llama-server
does: chunked, its lines split at odd places across reads; the path under the URL's
own, the API key sent; a 4xx refused and a 5xx, a stream cut short or a silent peer
lost; and an upstream the environment sends through a proxy still goes through httpx,
to the proxy. The real llama-server is tests/test_remote_*.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from lmsp.engines.base import Sampling
from lmsp.engines.upstream import Chunk, RemoteSpec, UpstreamLost, UpstreamRefused, stream
from lmsp.engines.upstream_http import ExchangeLost, direct, post

LLAMA = {"dialect": "llama-server"}


def sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)


ANSWER = sse(
    {"content": "a", "tokens": [11], "stop": False},
    {"content": "b", "tokens": [12], "stop": False},
    {"content": "", "tokens": [], "stop": True, "stop_type": "limit", "tokens_predicted": 2},
)

Answer = Callable[[asyncio.StreamWriter], Awaitable[None]]


def chunked(body: bytes, size: int = 7) -> Answer:
    """A 200 whose event stream comes in chunks of ``size`` bytes, a read each."""

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        for i in range(0, len(body), size):
            part = body[i : i + size]
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
            await asyncio.sleep(0.001)
        writer.write(b"0\r\n\r\n")

    return answer


def status(code: int, body: bytes) -> Answer:
    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s" % (code, len(body), body))

    return answer


async def serve(answer: Answer | None, seen: list[bytes]) -> asyncio.Server:
    """A peer on loopback: each request's head and body land in ``seen``; ``answer``
    writes the response (``None``: it never answers)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        seen.append(head + await reader.readexactly(length))
        if answer is None:
            await asyncio.sleep(30)
            return
        await answer(writer)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def run(answer: Answer | None, url_path: str = "", **spec: Any) -> tuple[list[Chunk], list[bytes]]:
    """The chunks of one completion from a peer answering ``answer``."""
    seen: list[bytes] = []

    async def main() -> list[Chunk]:
        server = await serve(answer, seen)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}{url_path}"
        assert direct(url)  # on the event loop's own socket, not through httpx
        remote = RemoteSpec(url, "m", capabilities=dict(LLAMA), **spec)
        try:
            async with httpx.AsyncClient(base_url=url) as client:
                return [c async for c in stream(client, remote, [1, 2], Sampling(), 8)]
        finally:
            server.close()

    return asyncio.run(main()), seen


def test_a_chunked_stream_split_at_odd_places_reads_as_its_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("UPSTREAM_KEY", "sk-test")
    chunks, seen = run(chunked(ANSWER), url_path="/base", api_key_env="UPSTREAM_KEY")
    assert [c.tokens for c in chunks] == [[11], [12], []]
    assert [c.content for c in chunks] == ["a", "b", ""]
    assert chunks[-1].stop == "limit" and chunks[-1].predicted == 2
    head, _, body = seen[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /base/completion HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer sk-test" in head
    assert json.loads(body)["prompt"] == [1, 2]


def test_a_4xx_is_refused_and_a_5xx_is_the_upstream_lost() -> None:
    refusal = json.dumps({"error": {"message": "bad grammar"}}).encode()
    with pytest.raises(UpstreamRefused, match=r"\(400\): bad grammar"):
        run(status(400, refusal))
    with pytest.raises(UpstreamLost, match="it answered 503"):
        run(status(503, b"busy"))


def test_a_stream_cut_short_is_the_upstream_lost() -> None:
    with pytest.raises(UpstreamLost, match="ended before the answer did"):
        run(chunked(ANSWER[: ANSWER.rindex(b"data:")]))  # the last chunk never comes


def test_a_peer_that_never_answers_is_lost_when_the_read_times_out() -> None:
    seen: list[bytes] = []

    async def main() -> None:
        server = await serve(None, seen)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            async with post(url, "/completion", b"{}", {}, 5.0, 0.2):
                pass
        finally:
            server.close()

    with pytest.raises(ExchangeLost, match="did not answer in time"):
        asyncio.run(main())
    assert len(seen) == 1


def test_a_refused_connection_is_lost() -> None:
    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        async with post(f"http://127.0.0.1:{port}", "/completion", b"{}", {}, 5.0, 5.0):
            pass

    with pytest.raises(ExchangeLost):
        asyncio.run(main())


def test_an_upstream_behind_a_proxy_goes_through_httpx_to_the_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The environment's proxy applies as it does to httpx: the request goes to the
    proxy (the peer here), in the absolute form a proxy is sent."""
    seen: list[bytes] = []

    async def main() -> list[Chunk]:
        proxy = await serve(chunked(ANSWER), seen)
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.sockets[0].getsockname()[1]}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        url = "http://upstream.invalid:8080"
        assert not direct(url)
        remote = RemoteSpec(url, "m", capabilities=dict(LLAMA))
        try:
            async with httpx.AsyncClient(base_url=url) as client:
                return [c async for c in stream(client, remote, [1, 2], Sampling(), 8)]
        finally:
            proxy.close()

    chunks = asyncio.run(main())
    assert [c.tokens for c in chunks] == [[11], [12], []]
    assert seen[0].startswith(b"POST http://upstream.invalid:8080/completion HTTP/1.1\r\n")


def test_what_goes_direct(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert direct("http://127.0.0.1:8080")
    assert direct("http://gpu-box:8000/v1")
    assert not direct("https://gpu-box:8000")
    assert not direct("http://user:secret@gpu-box:8000")  # httpx sends them as basic auth
    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")
    assert not direct("http://gpu-box:8000")
    monkeypatch.setenv("NO_PROXY", "gpu-box")
    assert direct("http://gpu-box:8000")
