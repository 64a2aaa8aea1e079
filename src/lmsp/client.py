"""Python clients for a running lmsp service: :class:`Client` (sync) and
:class:`AsyncClient` (asyncio), both on httpx.

``stream(response_id)`` yields a response's events and reconnects on its own with
``starting_after`` = the last sequence number seen, so a dropped connection or a
server restart costs nothing: no event is lost or repeated. Every error answer is
raised as :class:`APIError` carrying the section-8 fields; a service that cannot be
reached raises :class:`UnreachableError`.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import httpx

from lmsp import config, datadir
from lmsp.protocol.events import INCLUDE_LIFECYCLE
from lmsp.protocol.events import TERMINAL as TERMINAL_EVENTS

CALL_TIMEOUT = httpx.Timeout(60.0, connect=5.0)
# streams carry a ping every 15 s; a longer silence means the connection is gone
STREAM_TIMEOUT = httpx.Timeout(5.0, read=45.0)
BACKOFF = (0.1, 0.2, 0.5, 1.0, 2.0)


class ClientError(Exception):
    """Anything :class:`Client` raises."""


class UnreachableError(ClientError):
    """No answer from the service (not running, wrong address, connection lost)."""

    def __init__(self, url: str) -> None:
        super().__init__(f"cannot reach lmsp at {url}")
        self.url = url


class APIError(ClientError):
    """An error answer: ``status`` plus the section-8 ``type``, ``code``, ``message``,
    ``param``."""

    def __init__(self, status: int, error: dict[str, Any], headers: dict[str, str]) -> None:
        self.status = status
        self.type = str(error.get("type") or "")
        self.code = str(error.get("code") or "")
        self.message = str(error.get("message") or f"HTTP {status}")
        self.param: str | None = error.get("param")
        self.headers = headers
        super().__init__(self.message)

    def __str__(self) -> str:
        return f"{self.message} ({self.status} {self.code})"


def default_target(
    base_url: str | None = None, token: str | None = None, data_dir: Path | None = None
) -> tuple[str, str | None]:
    """``base_url``/``LMSP_URL`` (default: the address the service holding the data
    directory serves on, as its lock file says, else ``LMSP_HOST``:``LMSP_PORT``) and
    ``token``/``LMSP_TOKEN`` (default: the owner token in the data directory)."""
    settings = config.from_env()
    if data_dir is not None:
        settings = settings.with_overrides(data_dir=data_dir)
    url = base_url or os.environ.get("LMSP_URL")
    if not url:
        running = datadir.holder(settings.data_dir)
        url = running.url if running is not None and running.url else None
    url = url or f"http://{settings.host}:{settings.port}"
    secret = token or os.environ.get("LMSP_TOKEN")
    if secret is None and settings.owner_token_path.exists():
        secret = settings.owner_token_path.read_text().strip()
    return url, secret


def _root(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        error = response.json()["error"]
        if not isinstance(error, dict):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        error = {"type": "server_error", "code": "http_error", "message": response.text[:200]}
    raise APIError(response.status_code, error, dict(response.headers))


@dataclass
class _SSE:
    """Accumulates ``text/event-stream`` lines; :meth:`feed` returns complete events."""

    data: list[str] = field(default_factory=list)

    def feed(self, line: str) -> dict[str, Any] | None:
        if line == "":
            if not self.data:
                return None
            text, self.data = "\n".join(self.data), []
            if text == "[DONE]":  # the end marker of a responses stream
                return None
            event: dict[str, Any] = json.loads(text)
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if name == "data":
            self.data.append(value[1:] if value.startswith(" ") else value)
        return None


@dataclass
class _Follow:
    """Where a resumable stream stands: the last sequence number and when the current run
    of failed connections began."""

    after: int
    reconnect_timeout: float
    url: str
    failing_since: float | None = None
    attempt: int = 0
    done: bool = False  # the terminal event was delivered
    parser: _SSE = field(default_factory=_SSE)

    def request(self, path: str) -> dict[str, Any]:
        """How to (re)open the stream at ``path`` after the last event seen."""
        if path.startswith("/v1/responses/"):
            # the whole log, as the task's own stream gives it: LMSP lifecycle events too
            params = {"stream": "true", "starting_after": self.after, "include": INCLUDE_LIFECYCLE}
        else:
            params = {"after": self.after}
        accept = {"Accept": "text/event-stream"}
        return dict(method="GET", url=path, params=params, headers=accept, timeout=STREAM_TIMEOUT)

    def opened(self, response: httpx.Response) -> None:
        """A connection answered (an error answer, read by then, raises)."""
        _raise_for(response)
        self.failing_since = None
        self.parser = _SSE()

    def take(self, line: str) -> list[dict[str, Any]]:
        """The event ``line`` completes, unless it was delivered before (a replay after
        reconnecting); after the terminal one, :attr:`done`."""
        event = self.parser.feed(line)
        if event is None:
            return []
        seq = event.get("sequence_number")
        if isinstance(seq, int):
            if seq <= self.after:
                return []
            self.after = seq
        self.failing_since = None
        self.attempt = 0
        self.done = event.get("type") in TERMINAL_EVENTS
        return [event]

    def pause(self) -> float:
        """Seconds to wait before reconnecting; raises once reconnecting has failed for
        longer than ``reconnect_timeout``."""
        now = time.monotonic()
        if self.failing_since is None:
            self.failing_since = now
        elif now - self.failing_since > self.reconnect_timeout:
            raise UnreachableError(self.url)
        delay = BACKOFF[min(self.attempt, len(BACKOFF) - 1)]
        self.attempt += 1
        return delay


Transport = TypeVar("Transport", httpx.BaseTransport, httpx.AsyncBaseTransport)


class _Base(Generic[Transport]):
    """What the two clients share: the service's address and token, what each call sends
    and how an answer is read. Their subclasses do the I/O, one blocking, one async (as
    httpx's own clients do)."""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        reconnect_timeout: float = 120.0,
        transport: Transport | None = None,
    ) -> None:
        url, secret = default_target(base_url, token)
        self.base_url = _root(url)
        self.token = secret
        self.reconnect_timeout = reconnect_timeout
        auth = {"Authorization": f"Bearer {secret}"} if secret else {}
        self._connect(
            dict(base_url=self.base_url, headers=auth, timeout=CALL_TIMEOUT, transport=transport)
        )

    def _connect(self, options: dict[str, Any]) -> None:
        raise NotImplementedError

    def _answer(self, response: httpx.Response) -> Any:
        _raise_for(response)
        return response.json()

    def _following(self, after: int) -> _Follow:
        return _Follow(after, self.reconnect_timeout, self.base_url)

    @staticmethod
    def _creating(
        model: str, input: Any, idempotency_key: str | None, fields: dict[str, Any]
    ) -> dict[str, Any]:
        """``POST /v1/responses``: a foreground one may take as long as it generates."""
        timeout = CALL_TIMEOUT if fields.get("background") else httpx.Timeout(None, connect=5.0)
        key = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        body = {"model": model, "input": input, **fields}
        return dict(method="POST", path="/v1/responses", json=body, headers=key, timeout=timeout)

    @staticmethod
    def _listing(limit: int, **filters: str | None) -> dict[str, Any]:
        """``GET /v1/tasks``: a page of ``limit``, by each filter that is given."""
        given = {name: value for name, value in filters.items() if value}
        return {"method": "GET", "path": "/v1/tasks", "params": {"limit": limit, **given}}


class Client(_Base[httpx.BaseTransport]):
    """A synchronous client. ``base_url`` and ``token`` default to ``LMSP_URL`` /
    ``LMSP_TOKEN``, else the service of the data directory (``LMSP_DATA_DIR``) and its
    owner token."""

    def _connect(self, options: dict[str, Any]) -> None:
        self._http = httpx.Client(**options)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One call; the decoded JSON answer, or :class:`APIError`/:class:`UnreachableError`."""
        try:
            return self._answer(self._http.request(method, path, **kwargs))
        except httpx.TransportError as exc:
            raise UnreachableError(self.base_url) from exc

    # -- responses ---------------------------------------------------------------------
    def create(
        self, *, model: str, input: Any, idempotency_key: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        """``POST /v1/responses`` (``background=True`` answers at once with ``queued``)."""
        result: dict[str, Any] = self.request(
            **self._creating(model, input, idempotency_key, fields)
        )
        return result

    def retrieve(self, response_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", f"/v1/responses/{response_id}")
        return result

    def cancel(self, response_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("POST", f"/v1/responses/{response_id}/cancel")
        return result

    def delete(self, response_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("DELETE", f"/v1/responses/{response_id}")
        return result

    def stream(self, response_id: str, starting_after: int = -1) -> Iterator[dict[str, Any]]:
        """The response's events after ``starting_after`` until the terminal one (every
        event of its log, the LMSP lifecycle extensions too), reconnecting transparently
        (also across a server restart)."""
        return self._follow(f"/v1/responses/{response_id}", starting_after)

    # -- tasks -------------------------------------------------------------------------
    def tasks(
        self,
        *,
        status: str | None = None,
        limit: int = 20,
        after: str | None = None,
        client_id: str | None = None,
    ) -> dict[str, Any]:
        """A page of tasks, newest first (an admin token lists every client's)."""
        result: dict[str, Any] = self.request(
            **self._listing(limit, status=status, after=after, client_id=client_id)
        )
        return result

    def task(self, task_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", f"/v1/tasks/{task_id}")
        return result

    def cancel_task(self, task_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("POST", f"/v1/tasks/{task_id}/cancel")
        return result

    def follow_task(self, task_id: str, after: int = -1) -> Iterator[dict[str, Any]]:
        """A task's event log after ``after``, live until its terminal event; reconnects
        from the last sequence number seen."""
        return self._follow(f"/v1/tasks/{task_id}/events", after)

    def console_link(self) -> dict[str, Any]:
        """A one-time login link to the console (``admin``)."""
        result: dict[str, Any] = self.request("POST", "/v1/console/links")
        return result

    def activity(self) -> dict[str, Any]:
        """What the service does now (``admin``): models, sequences, queue, clients."""
        result: dict[str, Any] = self.request("GET", "/v1/service/activity")
        return result

    # -- models, clients, pairing ------------------------------------------------------
    def models(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.request("GET", "/v1/models")["data"]
        return result

    def clients(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.request("GET", "/v1/clients")["data"]
        return result

    def add_client(self, name: str, scopes: list[str]) -> dict[str, Any]:
        result: dict[str, Any] = self.request(
            "POST", "/v1/clients", json={"name": name, "scopes": scopes}
        )
        return result

    def revoke_client(self, client_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("DELETE", f"/v1/clients/{client_id}")
        return result

    def pairings(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.request("GET", "/v1/pairing")["data"]
        return result

    def approve_pairing(self, code: str, scopes: list[str] | None = None) -> dict[str, Any]:
        body = {"scopes": scopes} if scopes else None
        result: dict[str, Any] = self.request("POST", f"/v1/pairing/{code}/approve", json=body)
        return result

    def deny_pairing(self, code: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("POST", f"/v1/pairing/{code}/deny")
        return result

    def clear_pairings(self, source: str | None = None) -> list[dict[str, Any]]:
        """Deny every pending pairing request (only those from ``source``, if given)."""
        params = {"source": source} if source is not None else None
        result: list[dict[str, Any]] = self.request("DELETE", "/v1/pairing", params=params)["data"]
        return result

    # -- resumable event streams -------------------------------------------------------
    def _follow(self, path: str, after: int) -> Iterator[dict[str, Any]]:
        state = self._following(after)
        while True:
            try:
                with self._http.stream(**state.request(path)) as response:
                    if response.status_code >= 400:
                        response.read()
                    state.opened(response)
                    for line in response.iter_lines():
                        yield from state.take(line)
                        if state.done:
                            return
            except httpx.TransportError:
                pass
            time.sleep(state.pause())


class AsyncClient(_Base[httpx.AsyncBaseTransport]):
    """The asyncio twin of :class:`Client` (responses: create, retrieve, cancel, stream;
    tasks: list, get, cancel, follow)."""

    def _connect(self, options: dict[str, Any]) -> None:
        self._http = httpx.AsyncClient(**options)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            return self._answer(await self._http.request(method, path, **kwargs))
        except httpx.TransportError as exc:
            raise UnreachableError(self.base_url) from exc

    async def create(
        self, *, model: str, input: Any, idempotency_key: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        creating = self._creating(model, input, idempotency_key, fields)
        result: dict[str, Any] = await self.request(**creating)
        return result

    async def retrieve(self, response_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.request("GET", f"/v1/responses/{response_id}")
        return result

    async def cancel(self, response_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.request("POST", f"/v1/responses/{response_id}/cancel")
        return result

    def stream(self, response_id: str, starting_after: int = -1) -> AsyncIterator[dict[str, Any]]:
        return self._follow(f"/v1/responses/{response_id}", starting_after)

    async def tasks(
        self, *, status: str | None = None, limit: int = 20, client_id: str | None = None
    ) -> dict[str, Any]:
        listing = self._listing(limit, status=status, client_id=client_id)
        result: dict[str, Any] = await self.request(**listing)
        return result

    async def task(self, task_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.request("GET", f"/v1/tasks/{task_id}")
        return result

    async def cancel_task(self, task_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.request("POST", f"/v1/tasks/{task_id}/cancel")
        return result

    def follow_task(self, task_id: str, after: int = -1) -> AsyncIterator[dict[str, Any]]:
        return self._follow(f"/v1/tasks/{task_id}/events", after)

    async def _follow(self, path: str, after: int) -> AsyncIterator[dict[str, Any]]:
        state = self._following(after)
        while True:
            try:
                async with self._http.stream(**state.request(path)) as response:
                    if response.status_code >= 400:
                        await response.aread()
                    state.opened(response)
                    async for line in response.aiter_lines():
                        for event in state.take(line):
                            yield event
                        if state.done:
                            return
            except httpx.TransportError:
                pass
            await asyncio.sleep(state.pause())
