"""An engine: one loaded model serving its scheduling loop at the end of a channel.

:func:`process_main` is the target of an engine process (spawned, so it shares nothing
with the API process but the channel and the data directory's files): it loads the
model, says :class:`~lmsp.engines.protocol.Ready`, and runs the
:class:`~lmsp.engines.core.EngineCore` loop on its main thread until told to shut down
or until the API process is gone. By default it never outlives the API process: the
loop ends when the channel closes, and a watch thread exits the process when its parent
changes (the API process died while a long step or a load ran). Ctrl-C in a terminal
reaches the whole process group; the engine ignores it and lets the service stop it.

With an orphan timeout (``LMSP_ENGINE_ORPHAN_TIMEOUT``) the engine runs in a session
of its own and also listens on a socket (:class:`Attachments`: a Linux abstract Unix
socket, each connection authenticated with a key only the data directory's service can
derive, see :mod:`lmsp.engines.reattach`). When its channel closes without a
:class:`~lmsp.engines.protocol.Shutdown` (the API process was killed) it ends its
sequences — their tokens stay in its KV cache — and waits that long for the next API
process to connect; it then says :class:`~lmsp.engines.protocol.Ready` again and serves
the new channel with the same loaded model and cache. Nobody connecting in time: it
exits.

:func:`serve` is the same engine on a thread of the calling process, for fast tests of
the deterministic test engine (``Settings.in_thread_engines``); ``lmsp serve`` always
runs engines in processes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any, NoReturn

from lmsp.engines.base import EngineError, LoadOptions, Serving
from lmsp.engines.batch import ExactSteps, FastSteps
from lmsp.engines.core import EngineCore
from lmsp.engines.protocol import Channel, Error, Ready
from lmsp.engines.share import EmbedShare

log = logging.getLogger("lmsp.engine")


@dataclass(frozen=True)
class EngineSpec:
    """What an engine process needs to load its model (pickled to it)."""

    engine: Any  # an :class:`lmsp.engines.kind.Engine`: its ``load`` runs in the engine
    path: Path
    n_ctx: int
    options: LoadOptions
    model: str = ""  # the model's id, for log lines
    log_format: str = "text"
    log_level: int = logging.INFO
    orphan_timeout: float = 0.0  # seconds it waits for a new API process (0: it exits)
    address: str = ""  # the socket a new API process reattaches through
    authkey: bytes = b""  # … and the key its connections prove they know


class Died(BaseException):
    """An engine on a thread ends abruptly (the test engine's crash seam)."""


_in_process = False


def die() -> NoReturn:
    """End this engine abruptly, as a segfault would: a process is killed (``SIGKILL``:
    nothing is flushed, nothing said); an engine on a thread drops its channel."""
    if _in_process:
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # pragma: no cover - the signal is delivered first
    raise Died()


def process_main(channel: Channel, spec: EngineSpec, parent: int, niced: bool = False) -> None:
    """The engine process (see the module docstring); ``niced``: it runs at its
    priority already (a process started ahead, :mod:`lmsp.engines.ahead`)."""
    global _in_process
    _in_process = True
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if spec.options.nice > 0 and not niced:  # the model's threads give way to the API's
        os.nice(spec.options.nice)
    from lmsp import logs

    logs.configure(spec.log_format, spec.log_level)
    if spec.orphan_timeout > 0 and spec.address:
        os.setsid()  # a signal to the API's process group (a terminal's) is not for it
        attachments = Attachments(spec.address, spec.authkey)
        serve(channel, spec, attachments=attachments)
        return
    threading.Thread(target=_watch_parent, args=(parent,), name="lmsp-parent", daemon=True).start()
    serve(channel, spec, alive=lambda: os.getppid() == parent)


class Attachments:
    """The socket a new API process reattaches through: connections are accepted (and
    authenticated) on a thread of their own and kept until the engine waits for one
    (:meth:`next`). One may come before the engine has noticed that its old channel
    closed (a step or a prefix's save still running): it waits its turn rather than
    being refused. Only one API process runs on a data directory (its lock), so a
    connection never competes with a living one's channel; of several waiting, the
    newest is served (the older ones' services gave up or died)."""

    def __init__(self, address: str, authkey: bytes) -> None:
        self._listener = Listener(address, family="AF_UNIX", authkey=authkey)
        self._arrived: queue.SimpleQueue[Connection] = queue.SimpleQueue()
        threading.Thread(target=self._accept, name="lmsp-attach", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn = self._listener.accept()
            except OSError:
                return  # the listener is closed
            except Exception as exc:  # a wrong key (AuthenticationError), a broken peer
                log.warning("engine: a connection to reattach was refused: %s", exc)
                continue
            self._arrived.put(conn)

    def next(self, timeout: float) -> Connection | None:
        """The newest API process's channel, or ``None`` when none came within
        ``timeout``."""
        try:
            conn = self._arrived.get(timeout=timeout)
        except queue.Empty:
            return None
        while not self._arrived.empty():
            conn.close()
            conn = self._arrived.get_nowait()
        return conn

    def close(self) -> None:
        self._listener.close()


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(0)  # the API process is gone: nothing here is worth finishing


def serve(
    channel: Channel,
    spec: EngineSpec,
    alive: Any = lambda: True,
    attachments: Attachments | None = None,
) -> None:
    """Load the model and run the loop until shutdown (see the module docstring)."""
    try:
        backend = spec.engine.load(spec.path, spec.n_ctx, spec.options)
    except EngineError as exc:
        _say(channel, Error(None, exc.code, exc.message))
        return
    except Exception:
        log.exception("engine for %s: loading failed", spec.model)  # the words: log only
        _say(channel, Error(None, "model_load_failed", f"Loading {spec.model!r} failed."))
        return
    try:
        ready = Ready(os.getpid(), backend.n_ctx, backend.sequences, int(backend.memory_bytes()))
        channel.send([ready])
        if isinstance(backend, Serving):  # it serves the channel itself (a remote upstream)
            backend.serve(channel, alive)
            return
        policy = ExactSteps() if spec.options.exact else FastSteps()
        while True:
            share = EmbedShare(spec.options.embed_share)
            core = EngineCore(backend, channel, policy, alive=alive, share=share)
            with contextlib.suppress(OSError, EOFError):  # the API process went away
                core.run()
            if core.stopped or attachments is None:
                return
            channel.close()
            found = _reattached(attachments, spec, ready)
            if found is None:
                return
            channel = found
    except Died:
        channel.close()  # at once: the API side sees the engine gone, as after a crash
    except (OSError, EOFError):
        pass  # the API process is gone
    finally:
        if attachments is not None:
            attachments.close()
        backend.close()
        channel.close()


def _reattached(attachments: Attachments, spec: EngineSpec, ready: Ready) -> Channel | None:
    """Wait up to the orphan timeout for a new API process; its channel (told
    :class:`Ready`), or ``None``: exit."""
    log.info(
        "engine for %s: the service is gone; waiting %.0f s for it to reattach",
        spec.model,
        spec.orphan_timeout,
        extra={"event": "engine.orphaned", "model": spec.model},
    )
    deadline = time.monotonic() + spec.orphan_timeout
    while (left := deadline - time.monotonic()) > 0:
        conn = attachments.next(left)
        if conn is None:
            break
        try:
            conn.send([ready])
        except (OSError, ValueError):
            conn.close()  # it gave up already: wait for another
            continue
        log.info(
            "engine for %s: a new service reattached",
            spec.model,
            extra={"event": "engine.reattached", "model": spec.model},
        )
        return conn
    log.info(
        "engine for %s: no service reattached within %.0f s; exiting",
        spec.model,
        spec.orphan_timeout,
        extra={"event": "engine.orphan_exit", "model": spec.model},
    )
    return None


def _say(channel: Channel, message: Error) -> None:
    try:
        channel.send([message])
    except (OSError, ValueError):
        pass
    finally:
        channel.close()
