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
