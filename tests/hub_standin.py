"""A stand-in for the model hub's file API, on loopback, for the pull tests and bench.

A real HTTP server (a thread of the test) with the four routes lmsp uses:
``GET /api/models/{repo}``, ``GET /api/models/{repo}/tree/{rev}``, and
``HEAD``/``GET /{repo}/resolve/{rev}/{file}`` with ``Range``, ``ETag``,
``X-Linked-Size`` and ``X-Repo-Commit``. It can cut the first GETs of a file mid-way
(the connection closes with the body unfinished), throttle what it sends, list a wrong
SHA-256, and it records every file request with its ``Range``.

Hostile modes (``short``, of the hub or of one file): ``"empty"`` answers every file
GET with its headers and no byte (``Content-Length: 0``), ``"half"`` sends (and
declares) half of what is asked, ``"416"`` breaks off the first GET half-way and
refuses every ``Range`` with ``416``. A file listed larger than the file it
serves (``HubFile.size``) is sent whole, then every ``Range`` past its end gets ``416``.
``trickle`` (seconds, of the hub or of one file) sends the first 64 KiB of a file, then
one byte each ``trickle`` seconds until the stand-in is closed.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.standin_http import JsonHandler

COMMIT = "5f1c0e7d2a9b8c4e3f6a1b2c3d4e5f60718293a4"
CHUNK = 64 << 10


def variant_gguf(source: Path, target: Path) -> Path:
    """A copy of a GGUF file with one metadata byte changed (the first letter of its
    ``general.name`` flips case): still a whole model, with another digest."""
    shutil.copyfile(source, target)
    with target.open("r+b") as fh:
        head = fh.read(1 << 20)
        at = head.index(b"general.name") + len(b"general.name") + 4 + 8
        fh.seek(at)
        byte = fh.read(1)[0]
        fh.seek(at)
        fh.write(bytes([byte ^ 0x20]))
    return target


def split_gguf(source: Path, folder: Path, name: str) -> list[Path]:
    """``source`` written again as a split GGUF of two parts in ``folder`` (gguf's
    writer, as llama.cpp's gguf-split would): ``name-00001-of-00002.gguf`` and
    ``name-00002-of-00002.gguf``."""
    import gguf
    from gguf.scripts.gguf_new_metadata import copy_with_new_metadata

    reader = gguf.GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(folder / f"{name}.gguf"), arch, split_max_tensors=150)
    copy_with_new_metadata(reader, writer, {}, [])
    parts = sorted(folder.glob(f"{name}-*-of-00002.gguf"))
    assert len(parts) == 2
    return parts


def sha256_of(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            sha.update(chunk)
    return sha.hexdigest()


@dataclass
class HubFile:
    path: str
    source: Path | None  # None: listed, never served
    size: int
    sha256: str
    short: str | None = None  # this file's hostile mode (else the hub's)
    trickle: float | None = None  # this file's trickle (else the hub's)
    #: listed as a large (LFS) file with ``sha256``; else as a git blob, its ``oid`` the
    #: git hash of ``source`` (or ``sha256``'s first 40 digits: a wrong one to list)
    lfs: bool = True

    def listed(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "file", "size": self.size, "path": self.path}
        if self.lfs:
            oid = hashlib.sha1(self.path.encode()).hexdigest()
            lfs = {"oid": self.sha256, "size": self.size, "pointerSize": 134}
            return {**entry, "oid": oid, "lfs": lfs}
        if self.sha256:
            return {**entry, "oid": self.sha256[:40]}
        data = self.source.read_bytes() if self.source else b""
        oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        return {**entry, "oid": oid}


@dataclass
class Hub:
    """What the stand-in serves and what it saw."""

    repo: str
    files: list[HubFile]
    cut_first: int = 0  # the first N file GETs break off half-way
    rate: float | None = None  # bytes per second, None: as fast as it goes
    cdn: bool = False  # a file's URL redirects (302) to another host, as the real hub's CDN
    short: str | None = None  # "empty", "half" or "416": see the module's docstring
    trickle: float | None = None  # after the first 64 KiB, one byte each ``trickle`` s
    requests: list[dict[str, Any]] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)  # of every request
    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: threading.Event = field(default_factory=threading.Event)
    url: str = ""
    server: ThreadingHTTPServer | None = None

    def ranges(self) -> list[int]:
        """The start of every file GET (0 without ``Range``)."""
        return [r["start"] for r in self.requests if r["method"] == "GET"]

    def gets(self, path: str | None = None) -> int:
        """File GETs so far (of ``path``, or of every file)."""
        with self.lock:
            return sum(
                1 for r in self.requests if r["method"] == "GET" and path in (None, r["path"])
            )

    def close(self) -> None:
        self.closed.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def serve(hub: Hub) -> Hub:
    class Handler(JsonHandler):
        protocol_version = "HTTP/1.1"
        # as a real server does (nginx, uvicorn): headers and body are two writes, and
        # with Nagle's algorithm a kept-alive connection's second answer waited ~40 ms
        # for the client's delayed ACK
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            self._route(head=False)

        def do_HEAD(self) -> None:
            self._route(head=True)

        def _route(self, head: bool) -> None:
            path = self.path.split("?", 1)[0]
            with hub.lock:
                hub.authorizations.append(self.headers.get("Authorization"))
            repo = re.escape(hub.repo)
            if re.fullmatch(f"/api/models/{repo}", path):
                siblings = [{"rfilename": f.path} for f in hub.files]
                return self._json(200, {"id": hub.repo, "sha": COMMIT, "siblings": siblings})
            if re.fullmatch(f"/api/models/{repo}/tree/[^/]+", path):
                tree = [f.listed() for f in hub.files]
                tree.append({"type": "file", "oid": "0" * 40, "size": 12, "path": "README.md"})
                return self._json(200, tree)
            match = re.fullmatch(f"/{repo}/resolve/([^/]+)/(.+)", path)
            if hub.cdn and match is not None:  # to "localhost": another host than the hub's
                self.send_response(302)
                port = hub.url.rsplit(":", 1)[1]
                self.send_header("Location", f"http://localhost:{port}/cdn/{match.group(2)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            cdn = re.fullmatch("/cdn/(.+)", path)
            name = cdn.group(1) if cdn else match.group(2) if match else None
            if name is None:
                return self._json(404, {"error": "Repository not found"})
            file = next((f for f in hub.files if f.path == name), None)
            if file is None or file.source is None:
                return self._json(404, {"error": "Entry not found"})
            return self._file(file, head)

        def _file(self, file: HubFile, head: bool) -> None:
            size = file.source.stat().st_size if file.source else 0
            wanted = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
            start = int(wanted.group(1)) if wanted else 0
            short = file.short or hub.short
            with hub.lock:
                hub.requests.append(
                    {
                        "path": file.path,
                        "method": self.command,
                        "start": start,
                        "at": time.time(),
                        "host": self.headers.get("Host"),
                        "authorization": self.headers.get("Authorization"),
                    }
                )
                gets = sum(1 for r in hub.requests if r["method"] == "GET")
            cut = self.command == "GET" and (gets <= hub.cut_first or short == "416")
            if wanted and (start >= size or short == "416"):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            end = size  # past the last byte it sends
            if short == "empty":
                end = start
            elif short == "half":
                end = start + max((size - start) // 2, 1)
            self.send_response(206 if wanted else 200)
            if wanted:
                self.send_header("Content-Range", f"bytes {start}-{max(end, start + 1) - 1}/{size}")
            self.send_header("Content-Length", str(end - start))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", f'"{file.sha256}"')
            self.send_header("X-Linked-Size", str(size))
            self.send_header("X-Repo-Commit", COMMIT)
            self.end_headers()
            if head:
                return
            stop = start + (end - start) // 2 if cut else end
            assert file.source is not None
            began = time.monotonic()
            sent = 0
            with file.source.open("rb") as fh:
                trickle = file.trickle or hub.trickle
                if trickle:
                    return self._trickle(fh, start, stop, trickle)
                if not cut and not hub.rate:  # as fast as the kernel copies it
                    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                        self.wfile.flush()
                        if stop > start:
                            self.connection.sendfile(fh, start, stop - start)
                    return
                fh.seek(start)
                pos = start
                try:
                    while pos < stop:
                        chunk = fh.read(min(CHUNK, stop - pos))
                        self.wfile.write(chunk)
                        pos += len(chunk)
                        sent += len(chunk)
                        if hub.rate:
                            ahead = sent / hub.rate - (time.monotonic() - began)
                            if ahead > 0:
                                time.sleep(ahead)
                except (BrokenPipeError, ConnectionResetError):
                    return
            if cut:
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)

        def _trickle(self, fh: Any, start: int, stop: int, every: float) -> None:
            """The first 64 KiB, then a byte each ``every`` seconds (until closed)."""
            fh.seek(start)
            pos = start
            try:
                first = fh.read(min(CHUNK, stop - pos))
                self.wfile.write(first)
                self.wfile.flush()
                pos += len(first)
                while pos < stop and not hub.closed.wait(every):
                    self.wfile.write(fh.read(1))
                    self.wfile.flush()
                    pos += 1
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.close_connection = True

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    hub.server = server
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return hub
