"""Round 4, issue 37 step 3: one client against another's objects, through every use case
the routes now call (responses, tasks, conversations, webhooks), against a real server.

A victim client makes responses (one in a conversation, one continued), a conversation
with items, and webhooks of both faces (``/v1/webhooks``, ``/v1/webhook_endpoints``);
then, once its work has finished, a hostile client aims random operations at the
victim's ids: read, stream, page, cancel (with and without an ``Idempotency-Key``),
delete, change, rotate, test, append, continue, and lists filtered by the victim or
paged after its ids. Each answer must be what the use case promises a stranger (``404``
for an object, ``403`` for another client's list, ``400`` for a cursor it may not see),
in the shape of PROTOCOL.md section 8; no list may show a victim's id; and the victim's
rows (responses, tasks and their logs, conversations and items, webhooks and their
deliveries, idempotency keys, the audit log) are byte for byte what they were.

``make test`` runs a short pass; ``make torture`` (``LMSP_CAMPAIGN=long``) 600 steps.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.campaigns.invariants import long_run, report
from tests.helpers import Server, open_db

pytestmark = pytest.mark.slow

STEPS = 600 if long_run() else 60
TEST = "lmsp-test"
SCOPES = ["responses:read", "responses:write"]
SECTION_8 = {"type", "code", "message", "param"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(
        tmp_path_factory.mktemp("round4-usecases") / "data",
        env={"LMSP_TEST_ENGINE_DELAY": "0"},
    )
    srv.start()
    yield srv
    srv.stop()


def new_client(server: Server, name: str) -> tuple[str, str]:
    with server.client() as owner:
        made = owner.post("/v1/clients", json={"name": name, "scopes": SCOPES})
        assert made.status_code == 201, made.text
        return made.json()["id"], made.json()["token"]


def http_of(server: Server, token: str) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.Client(base_url=server.url, headers=headers, timeout=120)


@dataclass
class Victim:
    """The ids of what the victim made."""

    client_id: str
    responses: list[str] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)
    conversations: list[str] = field(default_factory=list)
    items: list[tuple[str, str]] = field(default_factory=list)  # (conversation, item)
    webhooks: list[str] = field(default_factory=list)

    def ids(self) -> set[str]:
        made = self.responses + self.tasks + self.conversations + self.webhooks
        return set(made) | {item for _, item in self.items}


def made_by_victim(server: Server, victim: Victim, token: str) -> None:
    """Everything the hostile client will aim at, finished before it starts."""
    with http_of(server, token) as http:
        conversation = http.post(
            "/v1/conversations",
            json={"items": [{"type": "message", "role": "user", "content": "kept"}]},
        ).json()["id"]
        victim.conversations.append(conversation)
        bodies: list[dict[str, Any]] = [
            {"input": "first"},
            {"input": "in a conversation", "conversation": conversation},
        ]
        for body in bodies:
            body.update(model=TEST, max_output_tokens=4)
            done = http.post("/v1/responses", json=body).json()
            victim.responses.append(done["id"])
            victim.tasks.append(done["task"]["id"])
        continued = {"model": TEST, "input": "and then", "max_output_tokens": 4}
        continued["previous_response_id"] = victim.responses[0]
        done = http.post("/v1/responses", json=continued).json()
        victim.responses.append(done["id"])
        victim.tasks.append(done["task"]["id"])
        page = http.get(f"/v1/conversations/{conversation}/items").json()["data"]
        victim.items.extend((conversation, item["id"]) for item in page)
        url = "http://127.0.0.1:9/hook"  # nothing listens: no delivery is due anyway
        hook = {"url": url, "events": ["response.completed"]}
        victim.webhooks.append(http.post("/v1/webhooks", json=hook).json()["id"])
        endpoint = {"name": "mine", "url": url, "event_types": ["response.completed"]}
        victim.webhooks.append(http.post("/v1/webhook_endpoints", json=endpoint).json()["id"])


def rows_of(server: Server, victim: Victim) -> dict[str, list[tuple[Any, ...]]]:
    """The victim's rows, table by table, as stored."""
    conn = open_db(server.data_dir)
    whose = (victim.client_id,)
    queries = {
        "responses": ("SELECT * FROM responses WHERE client_id = ? ORDER BY id", whose),
        "tasks": ("SELECT * FROM tasks WHERE client_id = ? ORDER BY id", whose),
        "task_events": (
            "SELECT e.* FROM task_events e JOIN tasks t ON t.id = e.task_id"
            " WHERE t.client_id = ? ORDER BY e.task_id, e.sequence_number",
            whose,
        ),
        "conversations": ("SELECT * FROM conversations WHERE client_id = ? ORDER BY id", whose),
        "conversation_items": (
            "SELECT i.* FROM conversation_items i JOIN conversations c"
            " ON c.id = i.conversation_id WHERE c.client_id = ? ORDER BY i.seq",
            whose,
        ),
        "webhooks": ("SELECT * FROM webhooks WHERE client_id = ? ORDER BY id", whose),
        "webhook_deliveries": ("SELECT * FROM webhook_deliveries ORDER BY 1", ()),
        "idempotency_keys": ("SELECT * FROM idempotency_keys ORDER BY 1", ()),
        "audit_log": ("SELECT * FROM audit_log ORDER BY 1", ()),
    }
    try:
        return {
            table: [tuple(row) for row in conn.execute(sql, args).fetchall()]
            for table, (sql, args) in queries.items()
        }
    finally:
        conn.close()


@dataclass
class Hostile:
    """The stranger's operations on the victim's ids, each with the status it must get."""

    http: httpx.Client
    victim: Victim
    rng: random.Random
    statuses: dict[int, int] = field(default_factory=dict)
    by_op: dict[str, int] = field(default_factory=dict)
    bad: list[str] = field(default_factory=list)

    def expect(self, name: str, answer: httpx.Response, status: int) -> None:
        self.by_op[name] = self.by_op.get(name, 0) + 1
        self.statuses[answer.status_code] = self.statuses.get(answer.status_code, 0) + 1
        if answer.status_code != status:
            self.bad.append(f"{name}: {answer.status_code} (not {status}) {answer.text[:200]}")
        elif status >= 400 and set(answer.json().get("error", {})) != SECTION_8:
            self.bad.append(f"{name}: error shape {answer.text[:200]}")

    def listed(self, name: str, path: str) -> None:
        answer = self.http.get(path, params={"limit": 100})
        self.expect(name, answer, 200)
        shown = {obj.get("id") for obj in answer.json().get("data", [])}
        if leaked := shown & self.victim.ids():
            self.bad.append(f"{name}: shows the victim's {sorted(leaked)}")

    def key(self) -> dict[str, str]:
        return {"Idempotency-Key": f"k{self.rng.randrange(8)}"} if self.rng.random() < 0.5 else {}

    def on_response(self) -> None:
        r = self.rng.choice(self.victim.responses)
        http, base = self.http, f"/v1/responses/{r}"
        ops: list[tuple[str, Callable[[], httpx.Response], int]] = [
            ("GET response", lambda: http.get(base), 404),
            ("GET response stream", lambda: http.get(base, params={"stream": "true"}), 404),
            ("GET input_items", lambda: http.get(f"{base}/input_items"), 404),
            ("cancel response", lambda: http.post(f"{base}/cancel", headers=self.key()), 404),
            ("DELETE response", lambda: http.delete(base), 404),
            (
                "continue response",
                lambda: http.post(
                    "/v1/responses",
                    json={"model": TEST, "input": "x", "previous_response_id": r},
                ),
                404,
            ),
        ]
        name, call, status = self.rng.choice(ops)
        self.expect(name, call(), status)

    def on_task(self) -> None:
        t = self.rng.choice(self.victim.tasks)
        http, base = self.http, f"/v1/tasks/{t}"
        ops: list[tuple[str, Callable[[], httpx.Response], int]] = [
            ("GET task", lambda: http.get(base), 404),
            ("GET task events", lambda: http.get(f"{base}/events"), 404),
            ("cancel task", lambda: http.post(f"{base}/cancel", headers=self.key()), 404),
            ("tasks after", lambda: http.get("/v1/tasks", params={"after": t}), 400),
            (
                "tasks of the victim",
                lambda: http.get("/v1/tasks", params={"client_id": self.victim.client_id}),
                403,
            ),
        ]
        name, call, status = self.rng.choice(ops)
        self.expect(name, call(), status)

    def on_conversation(self) -> None:
        c, item = self.rng.choice(self.victim.items)
        http, base = self.http, f"/v1/conversations/{c}"
        message = {"type": "message", "role": "user", "content": "mine now"}
        ops: list[tuple[str, Callable[[], httpx.Response], int]] = [
            ("GET conversation", lambda: http.get(base), 404),
            ("update conversation", lambda: http.post(base, json={"metadata": {"a": "b"}}), 404),
            ("DELETE conversation", lambda: http.delete(base), 404),
            ("GET items", lambda: http.get(f"{base}/items"), 404),
            ("append items", lambda: http.post(f"{base}/items", json={"items": [message]}), 404),
            ("GET item", lambda: http.get(f"{base}/items/{item}"), 404),
            ("DELETE item", lambda: http.delete(f"{base}/items/{item}"), 404),
            (
                "turn in conversation",
                lambda: http.post(
                    "/v1/responses", json={"model": TEST, "input": "x", "conversation": c}
                ),
                404,
            ),
        ]
        name, call, status = self.rng.choice(ops)
        self.expect(name, call(), status)

    def on_webhook(self) -> None:
        w = self.rng.choice(self.victim.webhooks)
        http = self.http
        hooks, endpoints = f"/v1/webhooks/{w}", f"/v1/webhook_endpoints/{w}"
        ops: list[tuple[str, Callable[[], httpx.Response], int]] = [
            ("GET webhook", lambda: http.get(hooks), 404),
            ("DELETE webhook", lambda: http.delete(hooks), 404),
            ("GET deliveries", lambda: http.get(f"{hooks}/deliveries"), 404),
            ("GET endpoint", lambda: http.get(endpoints), 404),
            (
                "update endpoint",
                lambda: http.post(endpoints, json={"url": "http://127.0.0.1:8/x"}),
                404,
            ),
            ("DELETE endpoint", lambda: http.delete(endpoints), 404),
            ("rotate secret", lambda: http.post(f"{endpoints}/rotate_secret", json={}), 404),
            (
                "test endpoint",
                lambda: http.post(f"{endpoints}/test", json={"event_type": "response.completed"}),
                404,
            ),
            (
                "endpoints after",
                lambda: http.get("/v1/webhook_endpoints", params={"after": w}),
                400,
            ),
        ]
        name, call, status = self.rng.choice(ops)
        self.expect(name, call(), status)

    def step(self) -> None:
        kind = self.rng.randrange(5)
        if kind == 0:
            self.on_response()
        elif kind == 1:
            self.on_task()
        elif kind == 2:
            self.on_conversation()
        elif kind == 3:
            self.on_webhook()
        else:
            path = self.rng.choice(["/v1/tasks", "/v1/webhooks", "/v1/webhook_endpoints"])
            self.listed(f"list {path}", path)


def test_round4_usecases_campaign(server: Server) -> None:
    started = time.monotonic()
    victim_id, victim_token = new_client(server, "victim")
    _, hostile_token = new_client(server, "stranger")
    victim = Victim(victim_id)
    made_by_victim(server, victim, victim_token)
    before = rows_of(server, victim)
    with http_of(server, hostile_token) as http:
        hostile = Hostile(http, victim, random.Random(37))
        for _ in range(STEPS):
            hostile.step()
    after = rows_of(server, victim)
    for table in before:
        if before[table] != after[table]:
            hostile.bad.append(f"{table}: the victim's rows changed")
    with http_of(server, victim_token) as http:  # the victim still has it all
        for response_id in victim.responses:
            if http.get(f"/v1/responses/{response_id}").status_code != 200:
                hostile.bad.append(f"the victim lost {response_id}")
    report(
        f"round4 use cases: {STEPS} hostile steps, {len(hostile.by_op)} kinds of operation,"
        f" statuses {dict(sorted(hostile.statuses.items()))},"
        f" {len(hostile.bad)} violations, {time.monotonic() - started:.0f} s"
    )
    assert hostile.bad == []
