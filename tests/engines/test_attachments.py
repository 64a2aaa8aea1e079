"""An orphaned engine's socket (:class:`lmsp.engines.worker.Attachments`): a new API
process may connect before the engine has noticed its old channel closed."""

from __future__ import annotations

import secrets
import threading
from multiprocessing.connection import Client, Connection

import pytest

from lmsp.engines.worker import Attachments

KEY = b"k" * 32


def _connect(address: str, into: list[Connection]) -> None:
    into.append(Client(address, family="AF_UNIX", authkey=KEY))


def test_a_connection_that_comes_before_the_engine_waits_is_handed_over() -> None:
    """The engine was still ending its old channel's step (or saving a prefix) when the
    new API process connected: it is kept for the engine, not closed (a restarted
    service then started a second engine: test_engine_reattach, once in a loaded run)."""
    address = f"\0lmsp-test-{secrets.token_hex(8)}"
    attachments = Attachments(address, KEY)
    try:
        early: list[Connection] = []
        _connect(address, early)  # the engine is not waiting yet
        threading.Event().wait(0.2)  # the listener's thread has taken it
        conn = attachments.next(5.0)
        assert conn is not None, "the early connection was refused"
        conn.send("ready")
        assert early[0].poll(5.0) and early[0].recv() == "ready"
    finally:
        attachments.close()


def test_of_two_waiting_connections_the_newest_is_served() -> None:
    """An older connection's service gave up waiting (and started an engine of its own,
    or died): the newest one is the living service."""
    address = f"\0lmsp-test-{secrets.token_hex(8)}"
    attachments = Attachments(address, KEY)
    try:
        made: list[Connection] = []
        for _ in range(2):
            _connect(address, made)
        threading.Event().wait(0.2)  # both accepted by the listener's thread
        conn = attachments.next(5.0)
        assert conn is not None
        conn.send("ready")
        assert made[1].poll(5.0) and made[1].recv() == "ready"
        with pytest.raises(EOFError):  # the older one is closed, not left hanging
            made[0].poll(5.0)
            made[0].recv()
    finally:
        attachments.close()
