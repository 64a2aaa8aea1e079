"""Round 4, item 7: one client's large conversations against everyone (issue 36), against
a real server with small quotas.

Generated: a hostile client's conversations filled by batches of 1 to 20 items of any
size (past ``LMSP_CONVERSATION_MAX_BYTES`` too), of every kind (messages, function calls
and outputs, ids sent back), deleted items and conversations, turns (``truncation``
``auto`` or not, in the background or not) and pages of items and input items at any
``after``/``limit``/``order``; meanwhile a second thread of the same client races
appends and turns on the same conversations, a probe polls ``/healthz`` and another
client's small responses must keep being answered. No answer may be a 5xx or lack the
section-8 shape; an append refused for a quota writes nothing; every conversation's
counted size is what it holds, and none holds more than its quotas but for what turns
accepted while it had room appended when they finished.

``make test`` runs a short pass; ``make torture`` (``LMSP_CAMPAIGN=long``) 300 steps.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.campaigns.invariants import long_run, report
from tests.helpers import Server, open_db

pytestmark = pytest.mark.slow

STEPS = 300 if long_run() else 25
MAX_ITEMS, MAX_BYTES, CLIENT_BYTES = 60, 64 << 10, 160 << 10
#: what turns accepted with room may append past a quota, per conversation: their input
#: (one item here) and their output (one message), for turns of both threads at once
SLACK_ITEMS = 4
SLACK_BYTES = 4 * 8192
TEST = "lmsp-test"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(
        tmp_path_factory.mktemp("round4-convo") / "data",
        env={
            "LMSP_TEST_ENGINE_DELAY": "0",
            "LMSP_CONVERSATION_MAX_ITEMS": str(MAX_ITEMS),
            "LMSP_CONVERSATION_MAX_BYTES": str(MAX_BYTES),
            "LMSP_CLIENT_CONVERSATION_BYTES": str(CLIENT_BYTES),
        },
    )
    srv.start()
    yield srv
    srv.stop()


def item(kind: str, size: int, n: int, ident: str | None) -> dict[str, Any]:
    text = f"{n}:" + "y" * size
    made: dict[str, Any]
    if kind == "call":
        made = {"type": "function_call", "call_id": f"c{n}", "name": "f", "arguments": text}
    elif kind == "output":
        made = {"type": "function_call_output", "call_id": f"c{n}", "output": text}
    else:
        made = {"type": "message", "role": kind, "content": text}
    if ident is not None:
        made["id"] = ident
    return made


ITEMS = st.lists(
    st.tuples(
        st.sampled_from(["user", "assistant", "call", "output"]),
        st.one_of(st.integers(0, 200), st.integers(1_000, 40_000)),
    ),
    min_size=1,
    max_size=20,
)
STEP = st.one_of(
    st.tuples(st.just("append"), ITEMS, st.booleans()),
    st.tuples(st.just("create"), ITEMS, st.booleans()),
    st.tuples(st.just("turn"), st.sampled_from(["auto", "disabled"]), st.booleans()),
    st.tuples(st.just("delete_item"), st.integers(0, 30), st.booleans()),
    st.tuples(st.just("page"), st.sampled_from(["asc", "desc"]), st.integers(1, 100)),
    st.tuples(st.just("input_page"), st.sampled_from(["asc", "desc"]), st.integers(1, 100)),
    st.tuples(st.just("delete"), st.just(0), st.booleans()),
)


class Campaign:
    def __init__(self, server: Server, token: str) -> None:
        self.server = server
        self.token = token
        self.statuses: dict[int, int] = {}
        self.bad: list[str] = []
        self.conversations: list[str] = []
        self.turns: list[str] = []  # response ids of turns
        self.seen_ids: list[str] = []  # item ids read back, sent again as given
        self.refused_writes = 0
        self.lock = threading.Lock()
        self.n = 0
        self.rng = random.Random(36)  # the choices among what the steps made

    def client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"}
        return httpx.Client(base_url=self.server.url, headers=headers, timeout=300)

    def checked(self, answer: httpx.Response, where: str) -> None:
        with self.lock:
            self.statuses[answer.status_code] = self.statuses.get(answer.status_code, 0) + 1
        if answer.status_code >= 500:
            self.bad.append(f"{where}: {answer.status_code} {answer.text[:200]}")
        elif answer.status_code >= 400:
            error = answer.json().get("error", {})
            if set(error) != {"type", "code", "message", "param"}:
                self.bad.append(f"{where}: error shape {answer.text[:200]}")

    def items(self, spec: list[tuple[str, int]], send_back: bool) -> list[dict[str, Any]]:
        out = []
        for kind, size in spec:
            self.n += 1
            ident = self.rng.choice(self.seen_ids) if send_back and self.seen_ids else None
            out.append(item(kind, size, self.n, ident))
        return out

    def pick(self) -> str | None:
        return self.rng.choice(self.conversations) if self.conversations else None

    def stored(self, marks: list[int]) -> int:
        """How many of the items numbered ``marks`` are stored (each item's text starts
        with its number)."""
        conn = open_db(self.server.data_dir)
        try:
            return sum(
                int(
                    conn.execute(
                        "SELECT count(*) FROM conversation_items WHERE item LIKE ?",
                        (f'%"{mark}:%',),
                    ).fetchone()[0]
                )
                for mark in marks
            )
        finally:
            conn.close()

    def append(self, http: httpx.Client, spec: list[tuple[str, int]], back: bool) -> None:
        conversation = self.pick()
        if conversation is None:
            return
        batch = self.items(spec, back)
        answer = http.post(f"/v1/conversations/{conversation}/items", json={"items": batch})
        self.checked(answer, "POST …/items")
        if answer.status_code == 409:
            self.refused_writes += 1
            marks = list(range(self.n - len(batch) + 1, self.n + 1))
            if found := self.stored(marks):
                self.bad.append(f"a refused append of {len(batch)} items stored {found}")
        elif answer.status_code == 200:
            self.seen_ids.extend(i["id"] for i in answer.json()["data"][:2])

    def turn(self, http: httpx.Client, truncation: str, background: bool) -> None:
        conversation = self.pick()
        if conversation is None:
            return
        body = {
            "model": TEST,
            "conversation": conversation,
            "input": "go on",
            "truncation": truncation,
            "background": background,
            "max_output_tokens": 4,
        }
        answer = http.post("/v1/responses", json=body)
        self.checked(answer, "POST /v1/responses")
        if answer.status_code in (200, 202):
            self.turns.append(answer.json()["id"])

    def step(self, http: httpx.Client, step: tuple[str, Any, Any]) -> None:
        kind, a, b = step
        if kind == "create":
            answer = http.post("/v1/conversations", json={"items": self.items(a, b)})
            self.checked(answer, "POST /v1/conversations")
            if answer.status_code == 200:
                self.conversations.append(answer.json()["id"])
        elif kind == "append":
            self.append(http, a, b)
        elif kind == "turn":
            self.turn(http, a, b)
        elif kind == "delete_item" and (conversation := self.pick()) is not None:
            page = http.get(f"/v1/conversations/{conversation}/items", params={"limit": 31})
            self.checked(page, "GET …/items")
            data = page.json().get("data", []) if page.status_code == 200 else []
            if data:
                gone = data[a % len(data)]["id"]
                self.checked(
                    http.delete(f"/v1/conversations/{conversation}/items/{gone}"), "DELETE item"
                )
        elif kind == "page" and (conversation := self.pick()) is not None:
            after = self.rng.choice(self.seen_ids) if b and self.seen_ids and a == "asc" else None
            params: dict[str, Any] = {"order": a, "limit": b}
            if after is not None:
                params["after"] = after
            self.checked(http.get(f"/v1/conversations/{conversation}/items", params=params), "page")
        elif kind == "input_page" and self.turns:
            turn = self.rng.choice(self.turns)
            self.checked(
                http.get(f"/v1/responses/{turn}/input_items", params={"order": a, "limit": b}),
                "GET input_items",
            )
        elif kind == "delete" and len(self.conversations) > 3 and self.rng.random() < 0.3:
            gone = self.conversations.pop(0)
            self.checked(http.delete(f"/v1/conversations/{gone}"), "DELETE conversation")


class Probe:
    """``/healthz`` every 10 ms from a thread of its own: the latencies, in seconds."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.latencies: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=60) as http:
            while not self._stop.is_set():
                began = time.perf_counter()
                self.failures += http.get(f"{self.url}/healthz").status_code != 200
                self.latencies.append(time.perf_counter() - began)
                self._stop.wait(0.01)

    def summary(self) -> str:
        ordered = sorted(self.latencies) or [float("nan")]
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        return f"p99 {p99 * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms ({len(ordered)} probes)"

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


class Racer:
    """The same client's second thread: appends and turns on the same conversations."""

    def __init__(self, campaign: Campaign) -> None:
        self.campaign = campaign
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self.campaign.client() as http:
            while not self._stop.is_set():
                conversation = self.campaign.pick()
                if conversation is not None:
                    if self.campaign.rng.random() < 0.5:
                        self.campaign.turn(
                            http, self.campaign.rng.choice(["auto", "disabled"]), False
                        )
                    else:
                        answer = http.post(
                            f"/v1/conversations/{conversation}/items",
                            json={"items": [item("user", 3000, -1, None) for _ in range(5)]},
                        )
                        self.campaign.checked(answer, "racing POST …/items")
                self._stop.wait(0.05)

    def __enter__(self) -> Racer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(600)


def sizes(data_dir: Path) -> list[tuple[str, int, int, int, int]]:
    conn = open_db(data_dir)
    try:
        rows = conn.execute(
            "SELECT c.id, c.item_count, c.item_bytes,"
            " (SELECT count(*) FROM conversation_items i WHERE i.conversation_id = c.id),"
            " (SELECT coalesce(sum(length(CAST(i.item AS BLOB))), 0) FROM conversation_items i"
            "  WHERE i.conversation_id = c.id) FROM conversations c"
        ).fetchall()
    finally:
        conn.close()
    return [(r[0], r[1], r[2], r[3], r[4]) for r in rows]


def test_round4_conversation_campaign(server: Server) -> None:
    started = time.monotonic()
    with server.client() as owner:
        made = owner.post(
            "/v1/clients",
            json={"name": "hoarder", "scopes": ["responses:read", "responses:write"]},
        )
        assert made.status_code == 201, made.text
    campaign = Campaign(server, made.json()["token"])
    bystander: list[int] = []
    stop = threading.Event()

    def other_client() -> None:
        body = {"model": TEST, "input": "Say hi.", "max_output_tokens": 3}
        with server.client(timeout=600) as http:
            while not stop.is_set():
                bystander.append(http.post("/v1/responses", json=body).status_code)
                stop.wait(0.2)

    @given(steps=st.lists(STEP, min_size=1, max_size=8))
    @settings(
        max_examples=STEPS, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    def run(steps: list[tuple[str, Any, Any]]) -> None:
        with campaign.client() as http:
            if len(campaign.conversations) < 2:
                campaign.step(http, ("create", [("user", 10)], False))
            for step in steps:
                campaign.step(http, step)

    other = threading.Thread(target=other_client, daemon=True)
    other.start()
    with Probe(server.url) as probe, Racer(campaign):
        run()
    stop.set()
    other.join(600)
    bad = campaign.bad
    for ident, items_counted, bytes_counted, items_held, bytes_held in sizes(server.data_dir):
        if (items_counted, bytes_counted) != (items_held, bytes_held):
            bad.append(
                f"{ident}: counted {items_counted} items / {bytes_counted} bytes,"
                f" holds {items_held} / {bytes_held}"
            )
        if items_held > MAX_ITEMS + SLACK_ITEMS or bytes_held > MAX_BYTES + SLACK_BYTES:
            bad.append(f"{ident}: holds {items_held} items, {bytes_held} bytes past its quotas")
    if probe.failures:
        bad.append(f"/healthz failed {probe.failures} times")
    if set(bystander) - {200}:
        bad.append(f"the other client's answers: {sorted(set(bystander))}")
    report(
        f"round-4 conversation campaign: {sum(campaign.statuses.values())} requests in"
        f" {time.monotonic() - started:.0f}s (statuses {dict(sorted(campaign.statuses.items()))});"
        f" {campaign.refused_writes} appends refused for a quota wrote nothing;"
        f" {len(campaign.turns)} turns; /healthz {probe.summary()};"
        f" the other client's {len(bystander)} small responses answered:"
        f" {set(bystander) == {200}}; {len(bad)} violations"
    )
    assert not bad, bad[:10]
