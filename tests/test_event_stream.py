"""A stream's HTTP response written below the framework (:mod:`lmsp.api.eventstream`),
through the real ``lmsp serve``: keep-alives between events, and a stopping server
that ends its open streams at once instead of waiting out its grace period for them,
their tasks left to recovery.
(A client that leaves, its task cancelled: tests/test_server.py; a revoked client's
stream: tests/test_revocation.py.)"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import Server, open_db

pytestmark = pytest.mark.slow


def test_keep_alives_come_between_the_events_of_a_live_stream(tmp_path: Path) -> None:
    srv = Server(
        tmp_path / "data",
        env={
            "LMSP_TEST_ENGINE_DELAY": "0.05",
            "LMSP_SSE_PING": "0.02",
            "LMSP_TEST_ENGINE_LENGTH": "40",
        },
    ).start()
    try:
        with srv.client() as http:
            body = {"model": "lmsp-test", "input": "hi", "stream": True}
            with http.stream("POST", "/v1/responses", json=body) as stream:
                assert stream.headers["content-type"] == "text/event-stream; charset=utf-8"
                assert stream.headers["cache-control"] == "no-store"
                assert stream.headers["x-accel-buffering"] == "no"
                text = stream.read().decode()
        lines = text.split("\n")
        assert ": ping" in lines  # ~2 s of answer, a keep-alive every 20 ms
        events = [line for line in lines if line.startswith("event: ")]
        assert events[-1] == "event: response.completed"
        assert text.endswith("data: [DONE]\n\n")
        # a keep-alive is a line of its own, never inside an event
        for i, line in enumerate(lines):
            if line == ": ping":
                assert i == 0 or lines[i - 1] == "" or lines[i - 1] == ": ping"
    finally:
        srv.stop()


def test_a_stopping_server_ends_its_open_streams_at_once(tmp_path: Path) -> None:
    """``SIGTERM`` with a stream open: the stream's response ends (its connection does
    not keep the server waiting out its grace period) and its task is not cancelled."""
    srv = Server(
        tmp_path / "data",
        env={"LMSP_TEST_ENGINE_DELAY": "0.2", "LMSP_TEST_ENGINE_LENGTH": "1000"},
    ).start()
    seen: list[str] = []
    ended = threading.Event()
    started = threading.Event()

    def follow() -> None:
        # a foreground stream: its client is still there, so its task is no departure
        body = {"model": "lmsp-test", "input": "hi", "stream": True, "on_restart": "resume"}
        headers = {"Authorization": f"Bearer {srv.token}"}
        with httpx.stream(
            "POST", f"{srv.url}/v1/responses", json=body, headers=headers, timeout=60
        ) as stream:
            for line in stream.iter_lines():
                seen.append(line)
                if '"response.output_text.delta"' in line:
                    started.set()
        ended.set()

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    try:
        assert started.wait(60)
        srv.stop()  # SIGTERM
        assert ended.wait(10)  # the stream's response was ended, not cut
        log = srv.log_path.read_text()
        # uvicorn waited for no stream: its grace period was not exceeded
        assert "timeout graceful shutdown exceeded" not in log
        assert "Waiting for connections to close" not in log
        assert not any(line.startswith("event: response.completed") for line in seen)
        # the task is left to recovery, as by a crash (its client did not leave)
        with contextlib.closing(open_db(srv.data_dir)) as db:
            assert db.execute("SELECT status FROM tasks").fetchone()["status"] == "running"
    finally:
        srv.stop()
        reader.join(10)


def test_the_server_settles_its_heap_once_started() -> None:
    """``lmsp serve``'s server, once started, has frozen the heap its start built out of
    the collector's sight and collects young objects every 50,000 allocations."""
    import asyncio
    import gc

    import uvicorn

    from lmsp.api.eventstream import GC_THRESHOLDS, Serving

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await receive()
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await send({"type": "lifespan.shutdown.complete"})

    before = gc.get_threshold()
    server = Serving(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))

    async def start_and_stop() -> tuple[tuple[int, int, int], int]:
        serving = asyncio.ensure_future(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        settled = (gc.get_threshold(), gc.get_freeze_count())
        server.should_exit = True
        await serving
        return settled

    try:
        thresholds, frozen = asyncio.run(start_and_stop())
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
    assert thresholds == GC_THRESHOLDS and frozen > 10_000
