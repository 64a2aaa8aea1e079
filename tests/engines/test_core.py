"""The engine core and its client without a model: a fake backend behind the real loop
and protocol (on a thread), and the test engine in a real engine process.

The loop steps every ready sequence together, reports what the prompt cache gave, ends
sequences at their budget, fails exactly the sequences of a failed step, frees a
cancelled one, queues submissions beyond the context's sequences, and exits when the
API side is gone. The client routes pieces to their streams and turns an engine's death
into :class:`EngineCrashed` after the pieces that came before.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lmsp.engines.base import EngineCrashed, EngineError, LoadOptions, Piece, Sampling
from lmsp.engines.batch import Logits, Request
from lmsp.engines.client import EngineClient
from lmsp.engines.core import EngineCore, Seq
from lmsp.engines.deterministic import (
    TEST_MODEL_BYTES,
    DeterministicEngine,
    DeterministicModel,
    reference,
)
from lmsp.engines.protocol import (
    PROGRESS_INTERVAL,
    Cancel,
    Done,
    Error,
    Progress,
    Shutdown,
    Submit,
    Tokens,
    unpack,
)
from lmsp.engines.worker import EngineSpec, die

GREEDY = Sampling(temperature=0)


class FakeBackend:
    """Writes ``prompt[0]`` tokens (the positions); caches ``prompt[1]`` prompt tokens."""

    n_ctx = 64
    max_step_tokens = 512

    def __init__(self, sequences: int = 4, fail_on: int | None = None) -> None:
        self.sequences = sequences
        self.fail_on = fail_on  # a prompt whose first step fails
        self.crash_on: int | None = None
        self.delay = 0.0
        self.steps: list[list[tuple[int, int]]] = []
        self.free = list(range(sequences))
        self.closed = False

    def memory_bytes(self) -> int:
        return 1

    def open(self, seq: Seq) -> None:
        if seq.prompt[0] < 0:
            raise EngineError("context_length_exceeded", "too long")
        seq.slot = self.free.pop()
        seq.held = seq.context[: seq.prompt[1]]
        seq.cached = seq.prompt[1]

    def decode(self, step: list[Request]) -> None:
        self.steps.append([(r.seq, len(r.tokens)) for r in step])
        time.sleep(self.delay)
        if self.fail_on is not None and any(r.tokens[0] == self.fail_on for r in step):
            raise EngineError("engine_error", "decode failed")
        for r in step:
            if r.logits:
                r.result = np.full(1, r.pos + len(r.tokens), np.float32)

    def evaluated(self, seq: Seq) -> None:
        return None

    def sent(self, seqs: list[Seq]) -> None:
        return None

    def pick(self, seq: Seq, logits: Logits) -> Piece | None:
        position = len(seq.resume) + seq.produced
        if self.crash_on is not None and position == self.crash_on:
            die()
        if position >= seq.prompt[0]:
            return None
        return Piece(100 + position, f"{position} ")

    def release(self, seq: Seq, intact: bool) -> None:
        self.free.append(seq.slot)

    def figures(self) -> dict[str, Any]:
        return {"free": len(self.free)}

    def close(self) -> None:
        self.closed = True


class FakeEngine:
    name = "fake"

    def __init__(self, backend: FakeBackend) -> None:
        self.backend = backend

    def load(self, path: Path, n_ctx: int, options: LoadOptions | None = None) -> FakeBackend:
        return self.backend


@pytest.fixture
def loop() -> Iterator[tuple[Any, FakeBackend, threading.Thread]]:
    here, there = multiprocessing.Pipe()
    backend = FakeBackend(sequences=2)
    thread = threading.Thread(target=EngineCore(backend, there).run, daemon=True)
    thread.start()
    yield here, backend, thread
    here.close()
    thread.join(10)


def collect(conn: Any, ids: set[int], timeout: float = 10) -> dict[int, list[Any]]:
    """Every message for ``ids`` until each has ended."""
    out: dict[int, list[Any]] = {i: [] for i in ids}
    open_ids = set(ids)
    deadline = time.monotonic() + timeout
    while open_ids:
        assert conn.poll(max(0.0, deadline - time.monotonic())), out
        for message in unpack(conn.recv()):
            out[message.id].append(message)
            if isinstance(message, Done | Error):
                open_ids.discard(message.id)
    return out


def pieces(messages: list[Any]) -> list[str]:
    return [p.text for m in messages if isinstance(m, Tokens) for p in m.pieces]


def test_sequences_step_together_and_end_at_their_budget(loop: Any) -> None:
    conn, backend, _ = loop
    conn.send([Submit(1, [6, 0], [], GREEDY), Submit(2, [9, 3, 1, 1, 1], [], GREEDY, max_tokens=4)])
    got = collect(conn, {1, 2})
    assert pieces(got[1]) == [f"{i} " for i in range(6)] and got[1][-1] == Done(1, "stop")
    assert pieces(got[2]) == [f"{i} " for i in range(4)] and got[2][-1] == Done(2, "length")
    assert got[2][0].cached_tokens == 3 and got[1][0].cached_tokens == 0
    together = [step for step in backend.steps if len(step) == 2]
    assert len(together) >= 3  # the two generated in the same steps


def test_a_long_prompt_says_how_far_it_is_read_now_and_then(loop: Any) -> None:
    """A prompt read in many steps (the exact schedule's 32-token chunks, each step
    0.15 s here) sends :class:`Progress` (read of total, the cached part, the time since
    its reading began), never two within ``PROGRESS_INTERVAL``; one read in a step
    says nothing."""
    conn, backend, _ = loop
    backend.n_ctx = 1024
    backend.delay = 0.15
    prompt = [2, 40] + [7] * 318  # 320 tokens, 40 of them cached: 9 chunks of 32
    conn.send([Submit(1, prompt, [], GREEDY), Submit(2, [2, 0, 7], [], GREEDY)])
    got = collect(conn, {1, 2}, timeout=60)
    told = [m for m in got[1] if isinstance(m, Progress)]
    assert told, got[1]  # 9 steps of at least 0.15 s: past the interval
    assert all(m.total == 320 and m.cached == 40 for m in told), told
    reads = [m.read for m in told]
    assert reads == sorted(set(reads)) and reads[0] > 40 and reads[-1] < 320, reads
    assert all(b.seconds - a.seconds >= PROGRESS_INTERVAL for a, b in itertools.pairwise(told))
    assert told[0].seconds >= PROGRESS_INTERVAL  # a prompt read sooner says nothing
    first_piece = next(i for i, m in enumerate(got[1]) if isinstance(m, Tokens))
    assert all(isinstance(m, Progress) for m in got[1][:first_piece])  # all before it
    assert not [m for m in got[2] if isinstance(m, Progress)]  # read in one step


def test_a_failed_step_fails_its_sequences_only(loop: Any) -> None:
    conn, backend, _ = loop
    backend.fail_on = 7
    conn.send([Submit(1, [7, 0], [], GREEDY)])
    assert collect(conn, {1})[1] == [Error(1, "engine_error", "decode failed")]
    backend.fail_on = None
    conn.send([Submit(2, [3, 0], [], GREEDY)])
    assert pieces(collect(conn, {2})[2]) == ["0 ", "1 ", "2 "]
    assert len(backend.free) == 2  # both sequences given back


def test_a_refused_submission_is_an_error_with_its_code(loop: Any) -> None:
    conn, _, _ = loop
    conn.send([Submit(1, [-1, 0], [], GREEDY)])
    assert collect(conn, {1})[1] == [Error(1, "context_length_exceeded", "too long")]


def test_cancel_frees_the_sequence_and_more_submissions_wait_their_turn(loop: Any) -> None:
    conn, backend, _ = loop
    backend.delay = 0.01  # 60 tokens take longer than the cancels to arrive
    long = [60, 0]
    conn.send([Submit(i, long, [], GREEDY) for i in (1, 2, 3)])  # two sequences: 3 waits
    conn.send([Cancel(3)])  # cancelled while it waits
    conn.send([Cancel(1)])
    got = collect(conn, {1, 2, 3})
    assert got[3] == [Done(3, "cancelled")]
    assert got[1][-1] == Done(1, "cancelled") and len(pieces(got[1])) < 60
    assert len(pieces(got[2])) == 60
    assert len(backend.free) == 2


def test_the_loop_ends_when_the_api_side_is_gone(loop: Any) -> None:
    conn, _, thread = loop
    conn.send([Submit(1, [60, 0], [], GREEDY)])
    conn.close()
    thread.join(10)
    assert not thread.is_alive()


def test_shutdown_ends_the_loop(loop: Any) -> None:
    conn, _, thread = loop
    conn.send([Shutdown()])
    thread.join(10)
    assert not thread.is_alive()


class Recording:
    """A channel end that writes down what it sends, beside the backend's calls."""

    def __init__(self, conn: Any, log: list[tuple[str, Any]]) -> None:
        self.conn, self.log = conn, log

    def poll(self, timeout: float) -> bool:
        return bool(self.conn.poll(timeout))

    def recv(self) -> Any:
        return self.conn.recv()

    def send(self, frame: Any) -> None:
        self.log.append(("send", [m for m in unpack(frame) if isinstance(m, Tokens)]))
        self.conn.send(frame)


def test_after_send_work_comes_after_the_tokens_are_out() -> None:
    """A backend's slow work (saving a prefix) runs once the step's tokens are sent,
    before the next step: never between a step and its tokens."""
    log: list[tuple[str, Any]] = []

    class Saving(FakeBackend):
        def decode(self, step: list[Request]) -> None:
            log.append(("decode", len(step)))
            super().decode(step)

        def sent(self, seqs: list[Seq]) -> None:
            log.append(("sent", sorted(s.id for s in seqs if s.reported)))

    here, there = multiprocessing.Pipe()
    core = EngineCore(Saving(sequences=2), Recording(there, log))
    thread = threading.Thread(target=core.run, daemon=True)
    thread.start()
    try:
        here.send([Submit(1, [3, 0], [], GREEDY)])
        collect(here, {1})
    finally:
        here.close()
        thread.join(10)
    kinds = [kind for kind, _ in log]
    assert kinds == ["decode", "send", "sent"] * 4, log  # 3 tokens, then the end
    for i in range(1, len(log), 3):
        assert bool(log[i][1]) == (i < 9) and log[i + 1][1] == ([1] if i < 9 else [])


def thread_client(backend: FakeBackend, tmp_path: Path) -> EngineClient:
    spec = EngineSpec(FakeEngine(backend), tmp_path / "model", 64, LoadOptions(2), "fake")
    exits: list[str] = []
    client = EngineClient(spec, in_thread=True, on_exit=lambda c, why: exits.append(why))
    return client.start(10)


def test_the_client_routes_pieces_and_reports_a_crash_after_them(tmp_path: Path) -> None:
    backend = FakeBackend(sequences=2)
    client = thread_client(backend, tmp_path)
    try:
        assert client.n_ctx == 64 and client.sequences == 2 and client.alive
        stream = client.generate([5, 0], [], GREEDY)
        assert [p.text for p in stream] == ["0 ", "1 ", "2 ", "3 ", "4 "]
        assert client.stats()["free"] == 2
        backend.crash_on = 3
        doomed = client.generate([9, 0], [], GREEDY)
        got: list[str] = []
        with pytest.raises(EngineCrashed) as crash:
            for piece in doomed:
                got.append(piece.text)
        assert got == ["0 ", "1 ", "2 "]  # every piece before the crash
        assert crash.value.code == "engine_crashed" and not client.alive
        with pytest.raises(EngineCrashed):
            client.generate([3, 0], [], GREEDY)
    finally:
        client.close()


def test_a_process_engine_dies_and_its_streams_hear_of_it(tmp_path: Path) -> None:
    """The test engine in a real engine process, killed with ``kill -9`` mid-stream."""
    model = tmp_path / "test.model"
    model.write_bytes(TEST_MODEL_BYTES)
    exits: list[str] = []
    spec = EngineSpec(DeterministicEngine(), model, 0, LoadOptions(2), "lmsp-test")
    os.environ["LMSP_TEST_ENGINE_DELAY"] = "0.05"
    try:
        client = EngineClient(
            spec, DeterministicModel(), on_exit=lambda c, why: exits.append(why)
        ).start(60)
    finally:
        os.environ.pop("LMSP_TEST_ENGINE_DELAY")
    try:
        assert client.pid is not None and client.pid != os.getpid()
        prompt = client.prompt_tokens([{"role": "user", "content": "hello"}])
        whole = [p.text for p in client.generate(prompt, [], GREEDY)]
        assert whole == [p.text for p in reference(prompt, GREEDY)]
        stream = client.generate(prompt, [], GREEDY)
        first = next(stream)
        os.kill(client.pid, signal.SIGKILL)
        rest: list[str] = []
        with pytest.raises(EngineCrashed) as crash:
            rest.extend(p.text for p in stream)
        assert [first.text, *rest] == whole[: 1 + len(rest)]
        assert "SIGKILL" in crash.value.message and exits and "SIGKILL" in exits[0]
    finally:
        client.close()
