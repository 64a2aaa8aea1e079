"""What the service says of a remote engine that exited because its upstream broke off:
the upstream by name, as the sequences the engine told before it went hear it — also a
sequence submitted while it was exiting (``make torture``'s R38 campaign saw one)."""

from __future__ import annotations

import multiprocessing
import sys
import threading
from pathlib import Path

import pytest

from lmsp.engines.base import EngineCrashed, LoadOptions, Sampling
from lmsp.engines.client import UPSTREAM_LOST, EngineClient
from lmsp.engines.protocol import Error, Submit
from lmsp.engines.worker import EngineSpec


def test_an_engine_that_lost_its_upstream_names_it() -> None:
    remote = {"url": "http://127.0.0.1:9", "upstream_model": "m", "replicas": ["http://[::1]:9"]}
    spec = EngineSpec(None, Path("m.gguf"), 64, LoadOptions(remote=remote), model="r")
    client = EngineClient(spec)
    process = multiprocessing.get_context("spawn").Process(target=sys.exit, args=(UPSTREAM_LOST,))
    process.start()
    process.join(60)
    client._runner = process
    said = client._describe_exit()
    assert said == "its upstream http://127.0.0.1:9 or http://[::1]:9 broke off"


def test_a_sequence_submitted_as_the_engine_exits_hears_why_it_exited() -> None:
    """The engine exits (its upstream lost) before the service's reader has seen its
    channel close, and a sequence is submitted in between: the send fails on the broken
    channel, and the sequence ends with the engine's reason, the upstream named — not
    with the broken pipe (``make torture``'s R38 campaign saw "The engine cannot be
    reached: [Errno 32] Broken pipe" once)."""
    remote = {"url": "http://127.0.0.1:9", "upstream_model": "m"}
    spec = EngineSpec(None, Path("m.gguf"), 64, LoadOptions(remote=remote), model="r")
    client = EngineClient(spec)
    context = multiprocessing.get_context("spawn")
    here, there = context.Pipe(duplex=True)
    process = context.Process(target=sys.exit, args=(UPSTREAM_LOST,))
    process.start()
    process.join(60)
    there.close()  # the engine's end: closed with it
    client._conn, client._runner, client.n_ctx = here, process, 64
    client._ready.set()
    stream = client.generate([1, 2, 3], [], Sampling())  # before the reader has looked
    reader = threading.Thread(target=client._read)
    reader.start()
    reader.join(30)
    with pytest.raises(EngineCrashed) as crashed:
        next(stream)
    assert "its upstream http://127.0.0.1:9 broke off" in str(crashed.value)


def test_an_engine_that_said_it_is_going_is_handed_no_more_work() -> None:
    """A remote engine whose upstream broke off tells every open sequence so, then
    exits. From the moment it has said so it is no longer ``alive`` — before its channel
    closes — so the host hands the next task to its restart, not to it: a task claimed in
    between is not failed by a crash it never met, and each crash the crash loop counts
    is one (on a loaded machine the R38 campaign's crash loop counted two tasks' failures
    as one crash, and the model was not failed after the third)."""
    remote = {"url": "http://127.0.0.1:9", "upstream_model": "m"}
    spec = EngineSpec(None, Path("m.gguf"), 64, LoadOptions(remote=remote), model="r")
    client = EngineClient(spec)
    here, there = multiprocessing.get_context("spawn").Pipe(duplex=True)
    client._conn, client.n_ctx = here, 64
    client._ready.set()
    stream = client.generate([1, 2, 3], [], Sampling())
    reader = threading.Thread(target=client._read)
    reader.start()
    try:
        (submitted,) = there.recv()
        assert isinstance(submitted, Submit) and client.alive
        lost = "The upstream http://127.0.0.1:9 of this model broke off (a test)."
        there.send([Error(submitted.id, "engine_crashed", lost)])
        with pytest.raises(EngineCrashed) as crashed:
            next(stream)
        assert lost in str(crashed.value)
        assert not client.alive  # said before the channel closed: no new work for it
    finally:
        there.close()  # the engine exits
        reader.join(30)
    assert not client.alive
