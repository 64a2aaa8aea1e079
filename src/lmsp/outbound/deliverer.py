"""The webhook sender: delivers the outbox's events (:mod:`lmsp.store.webhooks`).

One thread of its own runs an asyncio loop with one ``httpx`` client: redirects are not
followed, a try has 10 seconds (3 to connect), and every connection goes only to an
address the hosts rule admits (:mod:`lmsp.outbound.guard`). Tries run concurrently, at
most :data:`SLOTS` at once, :data:`PER_CLIENT` to the webhooks of any one client and
:data:`PER_WEBHOOK` to any one webhook, and due deliveries are taken in turns between
the clients that own the webhooks (:func:`lmsp.store.webhooks.due`): a client whose
receivers are slow or dead holds only its own share, and another client's deliveries go
out meanwhile (nor does a task wait: the outbox row is written by the task's own
transaction, and nothing there waits for a send).

The loop wakes after every commit (the database's commit listener, which on PostgreSQL
also hears other nodes' commits) and when the earliest pending delivery falls due. Each
pass reads which deliveries are due and, in one write, records the outcomes of the tries
that ended since the last pass and claims the due ones there is room for; then sends
those. A 2xx is delivered; anything
else (another status, a refused connection, a timeout, a redirect) is tried again after
``LMSP_WEBHOOK_RETRY`` seconds, then twice as long each time (at most an hour), until
``LMSP_WEBHOOK_GIVE_UP`` (24 h) has passed since the event: then it is ``failed``.

Every try of one event carries the same ``webhook-id`` (the event id), a fresh
``webhook-timestamp`` and the Standard Webhooks signature of ``id.timestamp.body``
(the ``standardwebhooks`` library signs). Delivery is at least once: a node that dies
between a receiver's 2xx and the write that records it sends again after its restart
(receivers dedupe by ``webhook-id``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from lmsp import __version__
from lmsp.ids import new_id
from lmsp.outbound import guard as outbound
from lmsp.protocol import webhooks as wire
from lmsp.store import webhooks as store
from lmsp.store.db import Database
from lmsp.store.sql import Conn

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

#: the longest a receiver may take to answer a try, and to accept its connection
TIMEOUT = 10.0
CONNECT_TIMEOUT = 3.0
#: tries in flight at once on this node, to the webhooks of any one client, and to any
#: one webhook: a client's dead receivers hold at most PER_CLIENT of the SLOTS
SLOTS = 128
PER_CLIENT = 16
PER_WEBHOOK = 4
#: a claim's lease: past the longest try, so no other node takes a row being tried
LEASE = 60.0
#: the most of a receiver's answer read (to keep its connection); the rest is never read
MAX_ANSWER = 64 * 1024
#: the longest a test event (``POST /v1/webhook_endpoints/{id}/test``) waits for its answer
TEST_TIMEOUT = 5.0
#: what a test event's ``data.id`` names: no response has it
TEST_RESPONSE_ID = "resp_test"
#: the shortest and longest naps between looks at the outbox
MIN_NAP = 0.01
MAX_NAP = 1.0
#: the table of deliveries to make (its changes are counted: :meth:`Deliverer._committed`)
OUTBOX = "webhook_deliveries"


def signed_headers(event_id: str, secret: str, body: bytes) -> dict[str, str]:
    """A try's headers: Standard Webhooks' id, a fresh timestamp and the signature of
    ``id.timestamp.body`` with ``secret``."""
    from standardwebhooks.webhooks import Webhook  # here: a start sends none

    stamp = datetime.now(tz=UTC)
    return {
        "content-type": "application/json",
        "webhook-id": event_id,
        "webhook-timestamp": str(int(stamp.timestamp())),
        "webhook-signature": Webhook(secret).sign(event_id, stamp, body),
    }


class NoAnswer(Exception):
    """A test event got no HTTP answer (refused, timed out, not HTTP); says why."""


async def send_test(
    url: str, secret: str, event_type: str, hosts: tuple[wire.HostRule, ...]
) -> int:
    """Send one signed test event to ``url`` now (connecting only where ``hosts``, the
    ``LMSP_WEBHOOK_HOSTS`` rule, admits) and return the status it answered (redirects
    not followed, :data:`TEST_TIMEOUT` for the whole try); raise :class:`NoAnswer` if it
    did not answer. Not a delivery: nothing is written, and a refusal is not tried
    again. The event names no real response (``data.id`` is :data:`TEST_RESPONSE_ID`);
    its ``webhook-id`` is a fresh event id."""
    import httpx

    event_id = new_id("evt")
    body = wire.event_body(event_id, event_type, int(time.time()), TEST_RESPONSE_ID)
    agent = {"user-agent": f"lmsp/{__version__} (webhooks)"}
    timeout = httpx.Timeout(TEST_TIMEOUT, connect=CONNECT_TIMEOUT)
    try:
        async with (
            asyncio.timeout(TEST_TIMEOUT),
            outbound.client(hosts, timeout, agent) as http,
            http.stream(
                "POST", url, content=body, headers=signed_headers(event_id, secret, body)
            ) as answer,
        ):
            return answer.status_code  # its body is not read
    except (TimeoutError, httpx.TimeoutException):
        raise NoAnswer(f"no answer within {TEST_TIMEOUT:.0f} s") from None
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise NoAnswer(wire.describe(f"{type(exc).__name__}: {exc}")) from None


@dataclass(frozen=True)
class DeliveryPolicy:
    retry: float  # the first wait after a failed try (LMSP_WEBHOOK_RETRY)
    give_up: float  # how long after its event a delivery is tried at all
    hosts: tuple[wire.HostRule, ...]  # LMSP_WEBHOOK_HOSTS


class Deliverer:
    """The sender thread: :meth:`start` with the service, :meth:`stop` before the
    database closes."""

    def __init__(self, db: Database, policy: DeliveryPolicy, node: str | None) -> None:
        self.db = db
        self.policy = policy
        # the claims' owner: this node on a shared database; on SQLite one node
        self.node = node or "local"
        self._shared_node = node
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._inflight: Counter[str] = Counter()  # webhook id → tries in flight
        self._owners: Counter[str] = Counter()  # client id → tries in flight to its webhooks
        self._tasks: set[asyncio.Task[None]] = set()
        self._outcomes: list[store.Outcome] = []
        self._ready = threading.Event()
        self._woken = False  # a wake is on its way to the loop (one is enough)
        self._outbox_seen = -1  # the outbox's change count the last commit showed
        self._http: httpx.AsyncClient | None = None  # made for the first try
        self.sent = 0  # tries made by this process (for tests and figures)

    # -- life ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Give back the claims this node held when it stopped (they are due now), then
        start sending."""
        node = self._shared_node
        self.db.write_sync(lambda c: store.release(c, node, time.time()))
        self.db.on_commit(self._committed)
        self._thread = threading.Thread(target=self._run, name="lmsp-webhooks", daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def stop(self) -> None:
        """Stop: tries in flight are abandoned and their claims given back."""
        self._stopping = True
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout=TIMEOUT + 5)
            self._thread = None
        if not self.db.closed:
            with contextlib.suppress(Exception):
                self.db.write_sync(lambda c: store.release(c, self.node, time.time()))

    def _committed(self) -> None:
        """After a commit (in the writer's thread; on PostgreSQL, after any node's):
        look at the outbox if it may have changed. One SQLite database counts the
        outbox's changes (:attr:`Database.versions`), so a commit that queued, claimed or
        settled no delivery — a task's flush of text, say — wakes nothing; the commits
        of a shared database's other nodes are not counted here, and each wakes it."""
        if not self.db.shared:
            seen = self.db.versions[OUTBOX]
            if seen == self._outbox_seen:
                return
            self._outbox_seen = seen
        self.wake()

    def wake(self) -> None:
        """Look at the outbox now (from any thread)."""
        loop, event = self._loop, self._wake
        if self._woken or loop is None or event is None or loop.is_closed():
            return
        self._woken = True  # commits in a burst: one call into the loop, not one each
        with contextlib.suppress(RuntimeError):  # the loop just closed
            loop.call_soon_threadsafe(event.set)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception:  # pragma: no cover - the loop must not die silently
            log.exception("the webhook sender stopped")

    # -- the loop -------------------------------------------------------------------------------
    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._ready.set()
        try:
            while not self._stopping:
                self._woken = False  # before the look: a commit from now on wakes it again
                self._wake.clear()
                nap = MAX_NAP
                try:
                    await self._pass()
                    nap = self._nap()
                except Exception:
                    log.exception("webhook deliveries: a pass failed; trying again")
                with contextlib.suppress(TimeoutError):  # not wait_for: see Broker.wait
                    async with asyncio.timeout(nap):
                        await self._wake.wait()
                await asyncio.sleep(MIN_NAP)  # a burst of commits wakes this once
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await self._record()
        finally:
            if self._http is not None:
                await self._http.aclose()

    def _client(self) -> httpx.AsyncClient:
        """The client the tries share, made for the first (httpx and its TLS context
        are ~0.1 s of CPU that a start with nothing to send does without)."""
        if self._http is None:
            import httpx

            self._http = outbound.client(
                self.policy.hosts,
                httpx.Timeout(TIMEOUT, connect=CONNECT_TIMEOUT),
                {"user-agent": f"lmsp/{__version__} (webhooks)"},
                httpx.Limits(max_connections=SLOTS, max_keepalive_connections=16),
            )
        return self._http

    def _nap(self) -> float:
        due = store.next_due(self.db.reader())
        if due is None:
            return MAX_NAP
        return max(0.0, min(MAX_NAP, due - time.time()))

    async def _pass(self) -> None:
        """One write: record the outcomes of the tries that ended since the last pass,
        and claim the due deliveries there is room for; then start sending those."""
        now = time.time()
        wanted = self._wanted(now)
        done, self._outcomes = self._outcomes, []
        if not wanted and not done:
            return
        node = self.node

        def job(conn: Conn) -> list[store.Claimed]:
            if done:
                store.settle(conn, done)
            return store.claim(conn, wanted, node, now, LEASE) if wanted else []

        try:
            claimed = await self.db.write(job)
        except BaseException:
            self._outcomes = done + self._outcomes  # recorded next time (the claims hold)
            raise
        for item in claimed:
            self._inflight[item.webhook_id] += 1
            self._owners[item.owner] += 1
            task = asyncio.create_task(self._send(self._client(), item))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _wanted(self, now: float) -> list[int]:
        """The due deliveries there is room for: free slots, and room left under each
        webhook's and each client's share (the list comes in turns between clients)."""
        free = SLOTS - sum(self._inflight.values())
        if free <= 0:
            return []
        wanted: list[int] = []
        hooks: dict[str, int] = {}
        owners: dict[str, int] = {}
        for row in store.due(self.db.reader(), now, PER_WEBHOOK, PER_CLIENT, SLOTS * 2):
            hook = hooks.setdefault(row.webhook_id, PER_WEBHOOK - self._inflight[row.webhook_id])
            owner = owners.setdefault(row.owner, PER_CLIENT - self._owners[row.owner])
            if hook > 0 and owner > 0:
                wanted.append(row.seq)
                hooks[row.webhook_id] -= 1
                owners[row.owner] -= 1
                if len(wanted) == free:
                    break
        return wanted

    async def _record(self) -> None:
        """The outcomes not yet written (at a stop)."""
        done, self._outcomes = self._outcomes, []
        if done:
            await self.db.write(lambda c: store.settle(c, done))

    # -- one try --------------------------------------------------------------------------------
    async def _send(self, http: httpx.AsyncClient, item: store.Claimed) -> None:
        import httpx

        try:
            wire.check_url(item.url, self.policy.hosts)
        except wire.InvalidUrl as exc:  # the operator narrowed LMSP_WEBHOOK_HOSTS since
            self._release_slot(item)
            self._done(item, False, None, wire.describe(exc), give_up=True)
            return
        status: int | None = None
        error: str | None = None
        body = wire.event_body(item.event_id, item.type, int(item.created_at), item.response_id)
        headers = signed_headers(item.event_id, item.secret, body)
        try:
            self.sent += 1
            async with (
                asyncio.timeout(TIMEOUT),  # the whole try, however slowly it drips
                http.stream("POST", item.url, content=body, headers=headers) as answer,
            ):
                status = answer.status_code
                # a short body is read to its end, so the connection is kept for the next
                # try; a long one is left unread (the connection is closed instead)
                read = 0
                async for chunk in answer.aiter_raw():
                    read += len(chunk)
                    if read > MAX_ANSWER:
                        break
            if not 200 <= status < 300:
                error = f"HTTP {status}"
        except (TimeoutError, httpx.TimeoutException):
            error = f"no answer within {TIMEOUT:.0f} s"
        except (httpx.HTTPError, httpx.InvalidURL) as exc:  # InvalidURL: not an HTTPError
            error = wire.describe(f"{type(exc).__name__}: {exc}")
        finally:
            self._release_slot(item)
        self._done(item, error is None, status, error)

    def _release_slot(self, item: store.Claimed) -> None:
        for counter, key in ((self._inflight, item.webhook_id), (self._owners, item.owner)):
            counter[key] -= 1
            if counter[key] <= 0:
                del counter[key]

    def _done(
        self,
        item: store.Claimed,
        delivered: bool,
        status: int | None,
        error: str | None,
        give_up: bool = False,
    ) -> None:
        at = time.time()
        next_at: float | None = None
        if not delivered and not give_up:
            next_at = at + wire.next_delay(item.attempts, self.policy.retry)
            if next_at > item.created_at + self.policy.give_up:
                next_at = None  # out of time: failed
        if not delivered:
            log.info(
                "webhook %s: delivery of %s failed (try %d): %s%s",
                item.webhook_id,
                item.event_id,
                item.attempts,
                error,
                "" if next_at is not None else "; giving up",
                extra={"event": "webhook.failed", "webhook_id": item.webhook_id},
            )
        self._outcomes.append(
            store.Outcome(item.seq, item.claim, delivered, status, error, at, next_at)
        )
        if self._wake is not None:
            self._wake.set()
