"""The model hub's file API, as lmsp uses it (PROTOCOL.md section 12).

Only four routes of a Hugging Face-compatible hub: ``GET /api/models/{repo}`` (the
commit a pull is pinned to), ``GET /api/models/{repo}/tree/{rev}`` (names, sizes and the
LFS SHA-256 of each file) and ``HEAD``/``GET /{repo}/resolve/{rev}/{file}`` with
``Range``. They are called with ``httpx`` rather than ``huggingface_hub``: a pull must
resume from the bytes lmsp itself has on disk (and recorded), hash them while they
arrive and keep that hash across a restart, and fail cleanly on a full disk — the
library keeps its own cache layout and its own resume files, which lmsp would have to
trust instead (docs/models.md, "Why not huggingface_hub").

A file's bytes are read with the standard library's ``http.client`` instead: its
``read`` takes a megabyte straight from the socket, where httpx's parser hands the body
over in 64 KiB pieces and held a pull to half of ``curl``'s speed (docs/performance.md).

``HF_TOKEN`` goes into the ``Authorization`` header of requests to the hub only (it is
dropped on a redirect to another host, e.g. the hub's CDN); it is never logged.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import re
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

import certifi

from lmsp import errors
from lmsp.store.pulls import HubFile

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_QUANT = "Q4_K_M"
CHUNK = 1 << 20
_REF = re.compile(
    r"^(?:https?://)?(?:hf\.co|huggingface\.co)/"
    r"(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95})"
    r"(?::(?P<quant>[A-Za-z0-9._-]{1,64}))?$"
)
_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


@dataclass(frozen=True)
class Reference:
    repo: str
    quant: str

    @property
    def canonical(self) -> str:
        return f"hf.co/{self.repo}:{self.quant}"

    @property
    def default_id(self) -> str:
        return f"{self.repo}:{self.quant}"


def parse_reference(text: str) -> Reference:
    """``hf.co/{owner}/{repo}[:{quant}]`` (``huggingface.co/…`` too); the quantization
    defaults to ``Q4_K_M``. Anything else: ``400 invalid_reference``."""
    repo, quant = split_reference(text, "from")
    return Reference(repo, quant or DEFAULT_QUANT)


def is_reference(text: str) -> bool:
    """Does ``text`` name something on the hub (``hf.co/…``, ``huggingface.co/…``, with
    or without ``https://``), well formed or not?"""
    return re.match(r"^(?:https?://)?(?:hf\.co|huggingface\.co)/", text.strip()) is not None


def split_reference(text: str, param: str) -> tuple[str, str | None]:
    """The repository and the quantization (``None`` when not named) of
    ``hf.co/{owner}/{repo}[:{quant}]``; else ``400 invalid_reference`` for ``param``."""
    match = _REF.match(text.strip())
    if match is None:
        raise errors.invalid(
            "A model reference is hf.co/{owner}/{repo}:{quant}, e.g. "
            "hf.co/bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M.",
            param,
            code="invalid_reference",
        )
    return match["repo"], match["quant"]


def _tag_pattern(quant: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![A-Za-z0-9]){re.escape(quant)}(?![A-Za-z0-9_])", re.IGNORECASE)


def quant_tags(names: list[str]) -> list[str]:
    """The quantization tags a repo's GGUF file names carry (for an error message)."""
    found = set()
    tag = re.compile(r"(?<![A-Za-z0-9])((?:I?Q\d[A-Za-z0-9_]*)|F16|F32|BF16)(?![A-Za-z0-9])", re.I)
    for name in names:
        base = _SPLIT.sub(lambda m: m["stem"] + ".gguf", name.rsplit("/", 1)[-1])
        for match in tag.finditer(base.removesuffix(".gguf")):
            found.add(match.group(1).upper())
    return sorted(found)


def pick_files(tree: list[dict[str, Any]], quant: str) -> list[HubFile]:
    """The GGUF file(s) of ``quant``: one file, or every part of a split file
    (``-00001-of-00003.gguf``) in order. ``400 quant_not_found`` / ``ambiguous_quant``."""
    ggufs = [
        entry
        for entry in tree
        if entry.get("type", "file") == "file"
        and str(entry.get("path", "")).lower().endswith(".gguf")
        and "mmproj" not in str(entry.get("path", "")).lower()
    ]
    tag = _tag_pattern(quant)
    chosen = [e for e in ggufs if tag.search(str(e["path"]))]
    if not chosen:
        tags = quant_tags([str(e["path"]) for e in ggufs])
        listed = f" It has: {', '.join(tags)}." if tags else " It has no GGUF file."
        raise errors.invalid(
            f"The repository has no GGUF file tagged {quant}.{listed}",
            "from",
            code="quant_not_found",
        )
    groups: dict[str, list[dict[str, Any]]] = {}
    for entry in chosen:
        split = _SPLIT.match(str(entry["path"]))
        groups.setdefault(split["stem"] if split else str(entry["path"]), []).append(entry)
    if len(groups) > 1:
        raise errors.invalid(
            f"Several GGUF files are tagged {quant}: {', '.join(sorted(groups))}.",
            "from",
            code="ambiguous_quant",
        )
    entries = next(iter(groups.values()))
    split = _SPLIT.match(str(entries[0]["path"]))
    if split is not None:
        entries.sort(key=lambda e: str(e["path"]))
        count = int(split["count"])
        if len(entries) != count:
            raise errors.invalid(
                f"The split GGUF file of {quant} lists {len(entries)} of its {count} parts.",
                "from",
                code="quant_not_found",
            )
    files = []
    for entry in entries:
        lfs = entry.get("lfs") or {}
        sha = lfs.get("oid") or lfs.get("sha256")
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise errors.LmspError(
                "hub_error", f"The hub lists no SHA-256 for {entry['path']}; it cannot be verified."
            )
        files.append(HubFile(str(entry["path"]), int(lfs.get("size", entry.get("size", 0))), sha))
    return files


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The certificates a hub's TLS is checked against (certifi's), loaded once: loading
    them takes ~20 ms, which every pull and every ``POST /v1/models/pull`` paid."""
    return ssl.create_default_context(cafile=certifi.where())


class Hub:
    """A client of the hub's file API (one ``httpx.Client``, closed with ``close``)."""

    def __init__(self, endpoint: str, token: str | None = None, timeout: float = 30) -> None:
        import httpx

        self.endpoint = endpoint.rstrip("/")
        self.timeout = timeout
        headers = {"User-Agent": "lmsp", "Accept-Encoding": "identity"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.headers = headers
        self.aborted = threading.Event()
        self._lock = threading.Lock()
        self._open: http.client.HTTPConnection | None = None
        self.http = httpx.Client(
            headers=headers,
            verify=tls_context(),
            follow_redirects=True,
            timeout=httpx.Timeout(timeout, connect=10),
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Hub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _get_json(self, path: str, what: str) -> Any:
        import httpx

        try:
            answer = self.http.get(f"{self.endpoint}{path}")
        except httpx.HTTPError as exc:
            raise hub_unreachable(exc) from None
        if answer.status_code in (401, 403):
            raise errors.LmspError(
                "hub_forbidden",
                f"The hub refuses access to {what} (a gated or private repository: "
                "set HF_TOKEN in the service's environment).",
                param="from",
            )
        if answer.status_code == 404:
            raise errors.invalid(f"The hub has no {what}.", "from", code="repo_not_found")
        if answer.status_code != 200:
            raise errors.LmspError(
                "hub_error", f"The hub answered {answer.status_code} for {what}."
            )
        try:
            return answer.json()
        except ValueError:
            raise errors.LmspError(
                "hub_error", f"The hub's answer for {what} is not JSON."
            ) from None

    def resolve(self, ref: Reference) -> tuple[str, list[HubFile]]:
        """The commit ``ref``'s repo is at now and the file(s) of its quantization."""
        revision, tree = self.tree(ref.repo)
        return revision, pick_files(tree, ref.quant)

    def tree(self, repo: str) -> tuple[str, list[dict[str, Any]]]:
        """The commit ``repo`` is at now, and its files as the hub lists them (path,
        size, the git blob hash ``oid``, and ``lfs`` with the SHA-256 of a large file)."""
        quoted = quote(repo)
        info = self._get_json(f"/api/models/{quoted}", f"repository {repo!r}")
        revision = info.get("sha") if isinstance(info, dict) else None
        if not isinstance(revision, str) or not revision:
            revision = "main"
        tree = self._get_json(
            f"/api/models/{quoted}/tree/{quote(revision)}?recursive=true", f"tree of {repo!r}"
        )
        if not isinstance(tree, list):
            raise errors.LmspError("hub_error", "The hub's file list is not a list.")
        return revision, [entry for entry in tree if isinstance(entry, dict)]

    def file_url(self, repo: str, revision: str, path: str) -> str:
        return f"{self.endpoint}/{quote(repo)}/resolve/{quote(revision)}/{quote(path)}"

    def abort(self) -> None:
        """Stop this client from another thread (a cancel, the shutdown): the file being
        read ends at once (its connection is shut down, so a read waiting on a hub that
        trickles returns), no new one is opened, and :attr:`aborted` wakes a back-off."""
        with self._lock:
            self.aborted.set()
            conn = self._open
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):  # the socket's own shutdown, under TLS too
                socket.socket.shutdown(conn.sock, socket.SHUT_RDWR)

    @contextlib.contextmanager
    def open_range(self, url: str, start: int) -> Iterator[tuple[int, Iterator[bytes]]]:
        """Open ``url`` from byte ``start`` (``Range``): ``(offset, chunks)``, ``offset``
        where the chunks begin (``0`` when the hub sent the whole file instead). A body
        that ends early ends the chunks: the caller asks again from where it got to.
        An attempt that cannot start or broke off raises :class:`FailedAttempt` saying
        what the hub did."""
        headers = dict(self.headers)
        if start:
            headers["Range"] = f"bytes={start}-"
        origin = urlsplit(url).netloc
        for _ in range(MAX_REDIRECTS + 1):
            conn = self._connect(url)
            try:
                try:
                    parts = urlsplit(url)
                    target = parts.path + (f"?{parts.query}" if parts.query else "")
                    conn.request("GET", target, headers=headers)
                    answer = conn.getresponse()
                except (OSError, http.client.HTTPException) as exc:
                    raise FailedAttempt.broken(exc) from None
                location = answer.getheader("location")
                if answer.status in (301, 302, 303, 307, 308) and location:
                    url = urljoin(url, location)
                    if urlsplit(url).netloc != origin:
                        headers.pop("Authorization", None)  # the token is the hub's only
                    continue
                if answer.status == 416:
                    raise FailedAttempt(
                        f"it answered 416 (Range Not Satisfiable) for the bytes from {start:,}"
                    )
                if answer.status not in (200, 206):
                    raise FailedAttempt(f"it answered {answer.status} for the file")
                offset = 0
                if answer.status == 206:
                    match = re.match(r"bytes (\d+)-", answer.getheader("content-range") or "")
                    offset = int(match.group(1)) if match else -1
                if offset < 0:
                    raise FailedAttempt("it sent a range it did not name")
                yield offset, _chunks(answer)
                return
            finally:
                with self._lock:
                    self._open = None
                conn.close()
        raise FailedAttempt("it redirected the file too many times")

    def _connect(self, url: str) -> http.client.HTTPConnection:
        """A connection to ``url``'s host, made, and the one :meth:`abort` shuts down."""
        parts = urlsplit(url)
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(
                parts.hostname or "", parts.port, timeout=self.timeout, context=tls_context()
            )
        elif parts.scheme == "http":
            conn = http.client.HTTPConnection(
                parts.hostname or "", parts.port, timeout=self.timeout
            )
        else:
            raise FailedAttempt(f"it sent a {parts.scheme!r} address")
        try:
            conn.connect()
        except OSError as exc:
            conn.close()
            raise FailedAttempt.broken(exc) from None
        with self._lock:
            if self.aborted.is_set():
                conn.close()
                raise FailedAttempt("the pull was stopped")
            self._open = conn
        return conn


#: redirects followed for a file (the hub's resolve URL to its CDN is one)
MAX_REDIRECTS = 5


class FailedAttempt(Exception):
    """One attempt at a file that ended short of it: ``what`` the hub (``it``) or the
    link did, in words for the task's error; ``link`` when the connection could not be made or
    broke off (the hub may be unreachable) rather than the hub answering something a
    pull cannot use (a ``416``, an error status, a body shorter than the file)."""

    def __init__(self, what: str, link: bool = False) -> None:
        super().__init__(what)
        self.what = what
        self.link = link

    @classmethod
    def broken(cls, cause: BaseException) -> FailedAttempt:
        return cls(f"the connection broke off ({type(cause).__name__})", link=True)


def _chunks(answer: http.client.HTTPResponse) -> Iterator[bytes]:
    while True:
        try:
            chunk = answer.read(CHUNK)
        except (OSError, http.client.HTTPException) as exc:
            raise FailedAttempt.broken(exc) from None
        if not chunk:
            return
        yield chunk


def hub_unreachable(exc: BaseException) -> errors.LmspError:
    return errors.LmspError(
        "hub_unavailable", f"The model hub cannot be reached ({type(exc).__name__})."
    )
