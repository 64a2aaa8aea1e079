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
from types import TracebackType
from typing import Any

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

    def seen(self, event: dict[str, Any]) -> bool:
        """``False`` for an event already delivered (a replay after reconnecting)."""
        seq = event.get("sequence_number")
        if isinstance(seq, int):
            if seq <= self.after:
                return False
            self.after = seq
        self.failing_since = None
        self.attempt = 0
        return True

    def connected(self) -> None:
        self.failing_since = None

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


class _Base:
    def __init__(self, base_url: str | None, token: str | None, reconnect_timeout: float) -> None:
        url, secret = default_target(base_url, token)
        self.base_url = _root(url)
        self.token = secret
        self.reconnect_timeout = reconnect_timeout

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    @staticmethod
    def _create_body(model: str, input: Any, fields: dict[str, Any]) -> dict[str, Any]:
        return {"model": model, "input": input, **fields}

    @staticmethod
    def _key(idempotency_key: str | None) -> dict[str, str]:
        return {"Idempotency-Key": idempotency_key} if idempotency_key else {}

    @staticmethod
    def _stream_params(path: str, after: int) -> dict[str, Any]:
        if path.startswith("/v1/responses/"):
            # the whole log, as the task's own stream gives it: LMSP lifecycle events too
            return {"stream": "true", "starting_after": after, "include": INCLUDE_LIFECYCLE}
        return {"after": after}


class Client(_Base):
    """A synchronous client. ``base_url`` and ``token`` default to ``LMSP_URL`` /
    ``LMSP_TOKEN``, else the service of the data directory (``LMSP_DATA_DIR``) and its
    owner token."""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        reconnect_timeout: float = 120.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, token, reconnect_timeout)
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=self._headers(),
            timeout=CALL_TIMEOUT,
            transport=transport,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One call; the decoded JSON answer, or :class:`APIError`/:class:`UnreachableError`."""
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise UnreachableError(self.base_url) from exc
        _raise_for(response)
        return response.json()

    # -- responses ---------------------------------------------------------------------
    def create(
        self, *, model: str, input: Any, idempotency_key: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        """``POST /v1/responses`` (``background=True`` answers at once with ``queued``)."""
        timeout = CALL_TIMEOUT if fields.get("background") else httpx.Timeout(None, connect=5.0)
        result: dict[str, Any] = self.request(
            "POST",
            "/v1/responses",
            json=self._create_body(model, input, fields),
            headers=self._key(idempotency_key),
            timeout=timeout,
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
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = status
        if after:
            params["after"] = after
        if client_id:
            params["client_id"] = client_id
        result: dict[str, Any] = self.request("GET", "/v1/tasks", params=params)
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
        state = _Follow(after, self.reconnect_timeout, self.base_url)
        while True:
            try:
                with self._http.stream(
                    "GET",
                    path,
                    params=self._stream_params(path, state.after),
                    headers={"Accept": "text/event-stream"},
                    timeout=STREAM_TIMEOUT,
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        _raise_for(response)
                    state.connected()
                    parser = _SSE()
                    for line in response.iter_lines():
                        event = parser.feed(line)
                        if event is None or not state.seen(event):
                            continue
                        yield event
                        if event.get("type") in TERMINAL_EVENTS:
                            return
            except httpx.TransportError:
                pass
            time.sleep(state.pause())


class AsyncClient(_Base):
    """The asyncio twin of :class:`Client` (responses: create, retrieve, cancel, stream;
    tasks: list, get, cancel, follow)."""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        reconnect_timeout: float = 120.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, token, reconnect_timeout)
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=self._headers(),
            timeout=CALL_TIMEOUT,
            transport=transport,
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise UnreachableError(self.base_url) from exc
        _raise_for(response)
        return response.json()

    async def create(
        self, *, model: str, input: Any, idempotency_key: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        timeout = CALL_TIMEOUT if fields.get("background") else httpx.Timeout(None, connect=5.0)
        result: dict[str, Any] = await self.request(
            "POST",
            "/v1/responses",
            json=self._create_body(model, input, fields),
            headers=self._key(idempotency_key),
            timeout=timeout,
        )
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
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = status
        if client_id:
            params["client_id"] = client_id
        result: dict[str, Any] = await self.request("GET", "/v1/tasks", params=params)
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
        state = _Follow(after, self.reconnect_timeout, self.base_url)
        while True:
            try:
                async with self._http.stream(
                    "GET",
                    path,
                    params=self._stream_params(path, state.after),
                    headers={"Accept": "text/event-stream"},
                    timeout=STREAM_TIMEOUT,
                ) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        _raise_for(response)
                    state.connected()
                    parser = _SSE()
                    async for line in response.aiter_lines():
                        event = parser.feed(line)
                        if event is None or not state.seen(event):
                            continue
                        yield event
                        if event.get("type") in TERMINAL_EVENTS:
                            return
            except httpx.TransportError:
                pass
            await asyncio.sleep(state.pause())
