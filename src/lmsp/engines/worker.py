"""An engine: one loaded model serving its scheduling loop at the end of a channel.

:func:`process_main` is the target of an engine process (spawned, so it shares nothing
with the API process but the channel and the data directory's files): it loads the
model, says :class:`~lmsp.engines.protocol.Ready`, and runs the
:class:`~lmsp.engines.core.EngineCore` loop on its main thread until told to shut down
or until the API process is gone. It never outlives the API process: the loop ends when
the channel closes, and a watch thread exits the process when its parent changes (the
API process died while a long step or a load ran). Ctrl-C in a terminal reaches the
whole process group; the engine ignores it and lets the service stop it.

:func:`serve` is the same engine on a thread of the calling process, for fast tests of
the deterministic test engine (``Settings.in_thread_engines``); ``lmsp serve`` always
runs engines in processes.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
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


def process_main(channel: Channel, spec: EngineSpec, parent: int) -> None:
    """The engine process (see the module docstring)."""
    global _in_process
    _in_process = True
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from lmsp import logs

    logs.configure(spec.log_format, spec.log_level)
    threading.Thread(target=_watch_parent, args=(parent,), name="lmsp-parent", daemon=True).start()
    serve(channel, spec, alive=lambda: os.getppid() == parent)


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(0)  # the API process is gone: nothing here is worth finishing


def serve(channel: Channel, spec: EngineSpec, alive: Any = lambda: True) -> None:
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
        memory = int(backend.memory_bytes())
        channel.send([Ready(os.getpid(), backend.n_ctx, backend.sequences, memory)])
        if isinstance(backend, Serving):  # it serves the channel itself (a remote upstream)
            backend.serve(channel, alive)
            return
        policy = ExactSteps() if spec.options.exact else FastSteps()
        share = EmbedShare(spec.options.embed_share)
        EngineCore(backend, channel, policy, alive=alive, share=share).run()
    except Died:
        channel.close()  # at once: the API side sees the engine gone, as after a crash
    except (OSError, EOFError):
        pass  # the API process is gone
    finally:
        backend.close()
        channel.close()


def _say(channel: Channel, message: Error) -> None:
    try:
        channel.send([message])
    except (OSError, ValueError):
        pass
    finally:
        channel.close()
