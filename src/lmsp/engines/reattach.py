"""Engines that outlive a crash of the API process, and finding them again.

With ``LMSP_ENGINE_ORPHAN_TIMEOUT`` above zero, an engine process keeps its loaded model
and KV cache when the API process that started it dies (``kill -9``, a crash), and waits
that long for the next API process on the same data directory to connect to it
(:class:`lmsp.engines.worker.Attachments`). This module is the API side's part: the
:class:`Registry` of the data directory's engines (``<data dir>/engines/``), one lease
file a model, written once the engine is ready and removed when it is stopped or dies,
and :meth:`Registry.reattach`, which a model host asks before it starts an engine.

Fencing: an engine is reattached only when

- its lease names the same model, blob digest and engine settings (a fingerprint of
  everything the engine was loaded with, and lmsp's version): a model or setting changed
  since gets a new engine, and the old one is told to stop;
- its process is alive and answers on its socket, proving it knows the key derived from
  the lease's nonce and the data directory's secret (``engines/secret``, mode 0600,
  made once): an engine of another data directory, or a lease file copied from one,
  fails that proof;
- it says :class:`~lmsp.engines.protocol.Ready` with the process id its lease names.

Anything else (a dead process, a refused or failed connection, a broken file) is stale:
the lease is removed and a new engine is started, as without this setting. On a node of a
PostgreSQL cluster each node has its data directory, so its own engines.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Client
from pathlib import Path
from typing import Any

from lmsp import __version__
from lmsp.engines.client import EngineClient
from lmsp.engines.protocol import Shutdown
from lmsp.engines.worker import EngineSpec

log = logging.getLogger("lmsp")

#: the longest a reattached engine may take to say it is ready (it notices its old
#: channel closed within a step, or half a second when idle)
ATTACH_TIMEOUT = 10.0


class Registry:
    """The leases of one data directory's engines (see the module docstring)."""

    def __init__(self, directory: Path, orphan_timeout: float) -> None:
        self.directory = directory
        self.orphan_timeout = orphan_timeout

    # -- a new engine ------------------------------------------------------------------
    def prepare(self, spec: EngineSpec) -> EngineSpec:
        """``spec`` for a new engine that may outlive this process: a fresh socket and
        its key."""
        nonce = secrets.token_hex(16)
        return replace(
            spec,
            orphan_timeout=self.orphan_timeout,
            address=f"\0lmsp-engine-{nonce}",
            authkey=self._key(nonce),
        )

    def record(self, client: EngineClient) -> None:
        """The engine of ``client`` is ready: write its lease (and remove it when the
        client stops it or sees it die)."""
        spec, pid = client.spec, client.pid
        if pid is None or not spec.address:
            return
        lease = {
            "model": spec.model,
            "fingerprint": fingerprint(spec),
            "pid": pid,
            "nonce": spec.address.rsplit("-", 1)[1],
        }
        path = self._path(spec.model)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(lease, fh)
        os.replace(tmp, path)
        client.released = lambda: self.forget(spec.model, pid)

    def forget(self, model: str, pid: int) -> None:
        """Remove ``model``'s lease if it still names ``pid``."""
        lease = self._read(model)
        if lease is not None and lease.get("pid") == pid:
            with contextlib.suppress(OSError):
                self._path(model).unlink()

    # -- an engine found again ---------------------------------------------------------
    def reattach(
        self, spec: EngineSpec, make: Callable[[EngineSpec], EngineClient]
    ) -> EngineClient | None:
        """The running engine an earlier API process left for ``spec``'s model,
        connected and ready, or ``None`` (none, stale or foreign: start one)."""
        lease = self._read(spec.model)
        if lease is None:
            return None
        path = self._path(spec.model)
        try:
            pid, nonce = int(lease["pid"]), str(lease["nonce"])
            same = lease.get("model") == spec.model and lease["fingerprint"] == fingerprint(spec)
        except (KeyError, TypeError, ValueError):
            path.unlink(missing_ok=True)
            return None
        address, key = f"\0lmsp-engine-{nonce}", self._key(nonce)
        if not _alive(pid):
            path.unlink(missing_ok=True)
            return None
        if not same:  # another blob or other settings: stop it, start one that fits
            log.info("the engine left for %s (pid %d) does not fit; stopping it", spec.model, pid)
            _tell_to_stop(address, key)
            path.unlink(missing_ok=True)
            return None
        client = make(
            replace(spec, orphan_timeout=self.orphan_timeout, address=address, authkey=key)
        )
        try:
            client.attach(pid, ATTACH_TIMEOUT)
        except Exception as exc:
            log.warning(
                "the engine left for %s (pid %d) was not reattached: %s", spec.model, pid, exc
            )
            client.stopping()
            client.close(timeout=0)
            path.unlink(missing_ok=True)
            return None
        client.released = lambda: self.forget(spec.model, pid)
        log.info(
            "reattached to the engine of %s (pid %d): its model loaded, its cache warm",
            spec.model,
            pid,
            extra={"event": "engine.reattached", "model": spec.model},
        )
        return client

    # -- files -------------------------------------------------------------------------
    def _path(self, model: str) -> Path:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        name = hashlib.sha256(model.encode()).hexdigest()[:24]
        return self.directory / f"{name}.json"

    def _read(self, model: str) -> dict[str, Any] | None:
        try:
            lease = json.loads(self._path(model).read_text())
        except (OSError, ValueError):
            return None
        return lease if isinstance(lease, dict) else None

    def _key(self, nonce: str) -> bytes:
        """The key an engine of this data directory proves it knows (see the module
        docstring): the nonce signed with the directory's secret."""
        return hmac.new(self._secret(), nonce.encode(), hashlib.sha256).digest()

    def _secret(self) -> bytes:
        path = self.directory / "secret"
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            return bytes.fromhex(path.read_text().strip())
        except (OSError, ValueError):
            pass
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        return bytes.fromhex(path.read_text().strip())


def fingerprint(spec: EngineSpec) -> str:
    """Everything an engine was loaded with that a reattached one must share."""
    o = spec.options
    data = [
        __version__,
        getattr(spec.engine, "name", type(spec.engine).__name__),
        spec.n_ctx,
        o.sequences,
        o.digest,
        o.embed_tokens,
        o.exact,
        o.kv_budget,
        o.embed_share,
        o.rope_scaling,
        o.remote,
    ]
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's process: not one of ours
    return True


def _tell_to_stop(address: str, key: bytes) -> None:
    """Ask an engine of this data directory that no longer fits to exit (it proves it
    is one by the key); nothing if it cannot be reached."""
    try:
        conn = Client(address, family="AF_UNIX", authkey=key)
    except Exception:
        return
    with contextlib.suppress(Exception):
        if conn.poll(ATTACH_TIMEOUT):
            conn.recv()  # its Ready: it listens now
        conn.send([Shutdown()])
    conn.close()
