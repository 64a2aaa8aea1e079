"""What the service says of a remote engine that exited because its upstream broke off:
the upstream by name, as the sequences the engine told before it went hear it — also a
sequence submitted while it was exiting (``make torture``'s R38 campaign saw one)."""

from __future__ import annotations

import multiprocessing
import sys
from pathlib import Path

from lmsp.engines.base import LoadOptions
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
