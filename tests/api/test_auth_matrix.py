"""Every route of the OpenAPI document, with no token, a token lacking the route's scope,
another client's token and the right token: exactly 401 / 403 / 404 / 2xx.

The routes and their scopes are read from ``/openapi.json`` (``require(scope)`` writes
the scope into each operation's ``security``), so a route added later is walked too:
it only needs a row in ``ROUTES`` saying how to build a valid request for it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi.testclient import TestClient

from lmsp.api.app import create_app
from lmsp.bootstrap import bundled_model_path
from lmsp.config import Settings
from lmsp.store.clients import SCOPES
from tests.hub_standin import Hub, HubFile, serve, sha256_of
from tests.webhook_receiver import Receiver

NON_ADMIN = [s for s in SCOPES if s != "admin"]
PULL_REPO = "matrix/SmolLM2-GGUF"
PULL_FILE = "smollm2-Q4_K_M.gguf"


@dataclass
class Call:
    method: str
    path: str
    json: Any = None
    params: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


class World:
    """The app in process and helpers that make the resources a request needs."""

    def __init__(self, http: TestClient, owner: str, hook_url: str = "") -> None:
        self.http = http
        self.owner = owner
        self.counter = 0
        self.hook_url = hook_url  # a receiver that answers 200 (a webhook test's target)

    def auth(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    def unique(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}-{self.counter}"

    def new_client(self, scopes: list[str]) -> tuple[str, str]:
        made = self.http.post(
            "/v1/clients",
            json={"name": self.unique("matrix"), "scopes": scopes},
            headers=self.auth(self.owner),
        )
        assert made.status_code == 201, made.text
        return made.json()["id"], made.json()["token"]

    def finished_response(self, token: str) -> dict[str, Any]:
        created = self.http.post(
            "/v1/responses",
            json={"model": "lmsp-test", "input": "matrix", "background": True},
            headers=self.auth(token),
        )
        assert created.status_code == 202, created.text
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            obj = self.http.get(f"/v1/responses/{created.json()['id']}", headers=self.auth(token))
            if obj.json()["status"] == "completed":
                return obj.json()  # type: ignore[no-any-return]
            time.sleep(0.01)
        raise AssertionError("the response never completed")

    def pending_pairing(self) -> dict[str, Any]:
        made = self.http.post("/v1/pairing", json={"client_name": self.unique("agent")})
        assert made.status_code == 201, made.text
        return made.json()  # type: ignore[no-any-return]

    def approved_pairing(self) -> dict[str, Any]:
        pending = self.pending_pairing()
        approved = self.http.post(
            f"/v1/pairing/{pending['id']}/approve", headers=self.auth(self.owner)
        )
        assert approved.status_code == 200, approved.text
        return pending

    def alias(self) -> str:
        name = self.unique("alias")
        made = self.http.put(
            f"/v1/model_aliases/{name}", json={"model": "lmsp-test"}, headers=self.auth(self.owner)
        )
        assert made.status_code == 200, made.text
        return name

    def imported_model(self) -> str:
        model_id = self.unique("matrix-model")
        made = self.http.post(
            "/v1/models",
            json={"id": model_id, "path": str(bundled_model_path())},
            headers=self.auth(self.owner),
        )
        assert made.status_code == 201, made.text
        return model_id


Build = Callable[[World, str], Call]


@dataclass(frozen=True)
class Route:
    """How to build a valid request (``build(world, token)``: resources it needs are made
    with ``token``, the right client's), the success status, and whether the resource
    belongs to a client (then another client's token answers 404)."""

    build: Build
    status: int
    owned: bool = False


def _resp(method: str, suffix: str = "", **kw: Any) -> Build:
    def build(world: World, token: str) -> Call:
        response = world.finished_response(token)
        return Call(method, f"/v1/responses/{response['id']}{suffix}", **kw)

    return build


def _task(method: str, suffix: str = "", **kw: Any) -> Build:
    def build(world: World, token: str) -> Call:
        task_id = world.finished_response(token)["task"]["id"]
        return Call(method, f"/v1/tasks/{task_id}{suffix}", **kw)

    return build


def _static(method: str, path: str, **kw: Any) -> Build:
    return lambda world, token: Call(method, path, **kw)


HOOK = {"url": "http://127.0.0.1:9/hook", "events": ["response.completed"]}


def _hook(method: str, suffix: str = "") -> Build:
    def build(world: World, token: str) -> Call:
        made = world.http.post("/v1/webhooks", json=HOOK, headers=world.auth(token))
        assert made.status_code == 201, made.text
        return Call(method, f"/v1/webhooks/{made.json()['id']}{suffix}")

    return build


def _endpoint(method: str, suffix: str = "", **kw: Any) -> Build:
    """A webhook of ``token``'s through ``/v1/webhook_endpoints``, its URL the world's
    receiver."""

    def build(world: World, token: str) -> Call:
        made = world.http.post(
            "/v1/webhook_endpoints",
            json={"name": "m", "url": world.hook_url, "event_types": ["response.completed"]},
            headers=world.auth(token),
        )
        assert made.status_code == 201, made.text
        return Call(method, f"/v1/webhook_endpoints/{made.json()['id']}{suffix}", **kw)

    return build


ENDPOINT = {"name": "m", "url": "http://127.0.0.1:9/hook", "event_types": ["response.failed"]}


def _conv(method: str, suffix: str = "", item: bool = False, **kw: Any) -> Build:
    """A conversation of ``token``'s with one item (``item``: the path names it)."""

    def build(world: World, token: str) -> Call:
        made = world.http.post(
            "/v1/conversations",
            json={"items": [{"role": "user", "content": "x"}]},
            headers=world.auth(token),
        )
        assert made.status_code == 200, made.text
        conv = made.json()["id"]
        path = f"/v1/conversations/{conv}{suffix}"
        if item:
            listed = world.http.get(f"/v1/conversations/{conv}/items", headers=world.auth(token))
            path += f"/{listed.json()['data'][0]['id']}"
        return Call(method, path, **kw)

    return build


ROUTES: dict[tuple[str, str], Route] = {
    ("GET", "/healthz"): Route(_static("GET", "/healthz"), 200),
    ("GET", "/v1/service"): Route(_static("GET", "/v1/service"), 200),
    # bound to loopback (as here): no token needed; see tests/test_metrics.py otherwise
    ("GET", "/metrics"): Route(_static("GET", "/metrics"), 200),
    ("GET", "/v1/service/activity"): Route(_static("GET", "/v1/service/activity"), 200),
    ("POST", "/v1/console/links"): Route(_static("POST", "/v1/console/links"), 201),
    ("GET", "/v1/models"): Route(_static("GET", "/v1/models"), 200),
    ("GET", "/v1/models/{model_id}"): Route(_static("GET", "/v1/models/lmsp-test"), 200),
    ("POST", "/v1/models"): Route(
        lambda w, t: Call(
            "POST", "/v1/models", json={"id": w.unique("imp"), "path": str(bundled_model_path())}
        ),
        201,
    ),
    ("DELETE", "/v1/models/{model_id}"): Route(
        lambda w, t: Call("DELETE", f"/v1/models/{w.imported_model()}"), 200
    ),
    ("PATCH", "/v1/models/{model_id}"): Route(
        lambda w, t: Call(
            "PATCH", f"/v1/models/{w.imported_model()}", json={"defaults": {"temperature": 0.5}}
        ),
        200,
    ),
    ("GET", "/v1/model_aliases"): Route(_static("GET", "/v1/model_aliases"), 200),
    ("PUT", "/v1/model_aliases/{alias}"): Route(
        lambda w, t: Call(
            "PUT", f"/v1/model_aliases/{w.unique('alias')}", json={"model": "lmsp-test"}
        ),
        200,
    ),
    ("DELETE", "/v1/model_aliases/{alias}"): Route(
        lambda w, t: Call("DELETE", f"/v1/model_aliases/{w.alias()}"), 200
    ),
    ("GET", "/v1/refusals"): Route(_static("GET", "/v1/refusals"), 200),
    ("POST", "/v1/models/pull"): Route(
        lambda w, t: Call(
            "POST",
            "/v1/models/pull",
            json={"from": f"hf.co/{PULL_REPO}:Q4_K_M", "id": w.unique("pulled")},
        ),
        202,
    ),
    ("POST", "/v1/models/{model_id}/verify"): Route(
        _static("POST", "/v1/models/lmsp-test/verify"), 200
    ),
    ("POST", "/v1/responses"): Route(
        _static(
            "POST", "/v1/responses", json={"model": "lmsp-test", "input": "x", "background": True}
        ),
        202,
    ),
    ("POST", "/v1/chat/completions"): Route(
        _static(
            "POST",
            "/v1/chat/completions",
            json={"model": "lmsp-test", "messages": [{"role": "user", "content": "x"}]},
        ),
        200,
    ),
    ("POST", "/v1/messages"): Route(
        _static(
            "POST",
            "/v1/messages",
            json={
                "model": "lmsp-test",
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "x"}],
            },
        ),
        200,
    ),
    ("POST", "/v1/messages/count_tokens"): Route(
        _static(
            "POST",
            "/v1/messages/count_tokens",
            json={"model": "lmsp-test", "messages": [{"role": "user", "content": "x"}]},
        ),
        200,
    ),
    ("GET", "/v1/messages/{message_id}"): Route(
        lambda w, t: Call("GET", f"/v1/messages/{w.finished_response(t)['id']}"), 200, owned=True
    ),
    ("POST", "/v1/completions"): Route(
        _static(
            "POST", "/v1/completions", json={"model": "lmsp-test", "prompt": "x", "max_tokens": 4}
        ),
        200,
    ),
    ("POST", "/v1/embeddings"): Route(
        _static("POST", "/v1/embeddings", json={"model": "lmsp-test", "input": "x"}), 200
    ),
    ("GET", "/v1/responses/{response_id}"): Route(_resp("GET"), 200, owned=True),
    ("DELETE", "/v1/responses/{response_id}"): Route(_resp("DELETE"), 200, owned=True),
    ("GET", "/v1/responses/{response_id}/input_items"): Route(
        _resp("GET", "/input_items"), 200, owned=True
    ),
    ("POST", "/v1/responses/{response_id}/cancel"): Route(
        _resp("POST", "/cancel"), 200, owned=True
    ),
    ("GET", "/v1/tasks"): Route(_static("GET", "/v1/tasks"), 200),
    ("GET", "/v1/tasks/{task_id}"): Route(_task("GET"), 200, owned=True),
    ("GET", "/v1/tasks/{task_id}/events"): Route(
        _task("GET", "/events", headers={"Accept": "application/json"}), 200, owned=True
    ),
    ("POST", "/v1/tasks/{task_id}/cancel"): Route(_task("POST", "/cancel"), 200, owned=True),
    ("GET", "/v1/pairing"): Route(_static("GET", "/v1/pairing"), 200),
    ("DELETE", "/v1/pairing"): Route(
        _static("DELETE", "/v1/pairing", params={"source": "192.0.2.1"}), 200
    ),
    ("POST", "/v1/pairing"): Route(
        lambda w, t: Call("POST", "/v1/pairing", json={"client_name": w.unique("agent")}), 201
    ),
    ("POST", "/v1/pairing/{pairing_id}/approve"): Route(
        lambda w, t: Call("POST", f"/v1/pairing/{w.pending_pairing()['id']}/approve"), 200
    ),
    ("POST", "/v1/pairing/{pairing_id}/deny"): Route(
        lambda w, t: Call("POST", f"/v1/pairing/{w.pending_pairing()['user_code']}/deny"), 200
    ),
    ("POST", "/v1/pairing/{pairing_id}/token"): Route(
        lambda w, t: Call("POST", f"/v1/pairing/{w.approved_pairing()['id']}/token"), 200
    ),
    ("GET", "/v1/clients"): Route(_static("GET", "/v1/clients"), 200),
    ("POST", "/v1/clients"): Route(
        lambda w, t: Call("POST", "/v1/clients", json={"name": "x", "scopes": ["models:read"]}),
        201,
    ),
    ("DELETE", "/v1/clients/{client_id}"): Route(
        lambda w, t: Call("DELETE", f"/v1/clients/{w.new_client(['models:read'])[0]}"), 200
    ),
    ("PATCH", "/v1/clients/{client_id}"): Route(
        lambda w, t: Call(
            "PATCH",
            f"/v1/clients/{w.new_client(['models:read'])[0]}",
            json={"limits": {"max_queued": 5}},
        ),
        200,
    ),
    ("GET", "/v1/usage"): Route(_static("GET", "/v1/usage"), 200),
    ("GET", "/v1/audit"): Route(_static("GET", "/v1/audit"), 200),
    ("GET", "/v1/webhooks"): Route(_static("GET", "/v1/webhooks"), 200),
    ("POST", "/v1/webhooks"): Route(_static("POST", "/v1/webhooks", json=HOOK), 201),
    ("GET", "/v1/webhooks/{webhook_id}"): Route(_hook("GET"), 200, owned=True),
    ("DELETE", "/v1/webhooks/{webhook_id}"): Route(_hook("DELETE"), 200, owned=True),
    ("GET", "/v1/webhooks/{webhook_id}/deliveries"): Route(
        _hook("GET", "/deliveries"), 200, owned=True
    ),
    ("GET", "/v1/webhook_endpoints"): Route(_static("GET", "/v1/webhook_endpoints"), 200),
    ("POST", "/v1/webhook_endpoints"): Route(
        _static("POST", "/v1/webhook_endpoints", json=ENDPOINT), 201
    ),
    ("GET", "/v1/webhook_endpoints/{webhook_endpoint_id}"): Route(
        _endpoint("GET"), 200, owned=True
    ),
    ("POST", "/v1/webhook_endpoints/{webhook_endpoint_id}"): Route(
        _endpoint("POST", json={"name": "renamed"}), 200, owned=True
    ),
    ("DELETE", "/v1/webhook_endpoints/{webhook_endpoint_id}"): Route(
        _endpoint("DELETE"), 200, owned=True
    ),
    ("POST", "/v1/webhook_endpoints/{webhook_endpoint_id}/rotate_secret"): Route(
        _endpoint("POST", "/rotate_secret", json={}), 200, owned=True
    ),
    ("POST", "/v1/webhook_endpoints/{webhook_endpoint_id}/test"): Route(
        _endpoint("POST", "/test", json={"event_type": "response.completed"}), 200, owned=True
    ),
    ("GET", "/v1/webhook_event_types"): Route(_static("GET", "/v1/webhook_event_types"), 200),
    ("POST", "/v1/responses/compact"): Route(
        _static("POST", "/v1/responses/compact", json={"model": "lmsp-test", "input": "x"}), 200
    ),
    ("POST", "/v1/responses/input_tokens"): Route(
        _static("POST", "/v1/responses/input_tokens", json={"model": "lmsp-test", "input": "x"}),
        200,
    ),
    ("POST", "/v1/conversations"): Route(_static("POST", "/v1/conversations", json={}), 200),
    ("GET", "/v1/conversations/{conversation_id}"): Route(_conv("GET"), 200, owned=True),
    ("POST", "/v1/conversations/{conversation_id}"): Route(
        _conv("POST", json={"metadata": {"k": "v"}}), 200, owned=True
    ),
    ("DELETE", "/v1/conversations/{conversation_id}"): Route(_conv("DELETE"), 200, owned=True),
    ("GET", "/v1/conversations/{conversation_id}/items"): Route(
        _conv("GET", "/items"), 200, owned=True
    ),
    ("POST", "/v1/conversations/{conversation_id}/items"): Route(
        _conv("POST", "/items", json={"items": [{"role": "user", "content": "y"}]}),
        200,
        owned=True,
    ),
    ("GET", "/v1/conversations/{conversation_id}/items/{item_id}"): Route(
        _conv("GET", "/items", item=True), 200, owned=True
    ),
    ("DELETE", "/v1/conversations/{conversation_id}/items/{item_id}"): Route(
        _conv("DELETE", "/items", item=True), 200, owned=True
    ),
}


@pytest.fixture
def world(settings: Settings) -> Iterator[World]:
    # a stand-in hub listing the bundled model itself: a pull of it is accepted and,
    # its blob already in the store, fetches nothing
    bundled = bundled_model_path()
    hub = serve(
        Hub(PULL_REPO, [HubFile(PULL_FILE, bundled, bundled.stat().st_size, sha256_of(bundled))])
    )
    roomy = dataclasses.replace(
        settings,
        max_pending_pairings=1000,
        max_pending_pairings_per_source=1000,
        hf_endpoint=hub.url,
    )
    receiver = Receiver().start()
    try:
        with TestClient(create_app(roomy)) as http:
            owner = (settings.data_dir / "owner.token").read_text().strip()
            yield World(http, owner, receiver.url)
    finally:
        receiver.stop()
        hub.close()


def operations(world: World) -> list[tuple[str, str, str | None]]:
    """``(method, path, scope)`` for every operation of the OpenAPI document; scope
    ``None`` means the route needs no token."""
    doc = world.http.get("/openapi.json").json()
    ops = []
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            security = op.get("security") or []
            scopes = [s for requirement in security for s in requirement.get("bearer", [])]
            assert len(scopes) <= 1, (method, path, scopes)
            ops.append((method.upper(), path, scopes[0] if scopes else None))
    return ops


def send(world: World, call: Call, token: str | None) -> Any:
    headers = dict(call.headers)
    if token is not None:
        headers.update(world.auth(token))
    return world.http.request(
        call.method, call.path, json=call.json, params=call.params, headers=headers
    )


def test_every_route_answers_401_403_404_2xx_exactly(world: World) -> None:
    ops = operations(world)
    missing = [f"{m} {p}" for m, p, _ in ops if (m, p) not in ROUTES]
    assert not missing, f"add a row to ROUTES for: {missing}"
    assert len(ops) >= 20
    outcomes: list[tuple[str, str, str, int]] = []
    for method, path, scope in ops:
        route = ROUTES[(method, path)]
        if scope is None:
            for label in ("none", "wrong", "other", "right"):
                token = None if label == "none" else world.new_client(["models:read"])[1]
                response = send(world, route.build(world, world.owner), token)
                assert response.status_code == route.status, (method, path, label, response.text)
                outcomes.append((method, path, label, response.status_code))
            continue
        # an owner of responses must make them and see them finish
        extra = [s for s in ("responses:read", "responses:write") if route.owned and s != scope]
        _, right = world.new_client([scope, *extra])
        _, other = world.new_client([scope, *extra])
        _, wrong = world.new_client([s for s in NON_ADMIN if s != scope])
        expected = {
            "none": (None, 401),
            "wrong": (wrong, 403),
            "other": (other, 404 if route.owned else route.status),
            "right": (right, route.status),
        }
        for label, (token, status) in expected.items():
            response = send(world, route.build(world, right), token)
            assert response.status_code == status, (method, path, label, response.text)
            outcomes.append((method, path, label, status))
            if status >= 400:
                error = response.json()["error"]
                if path.startswith("/v1/messages"):  # Anthropic's envelope there
                    assert response.json()["type"] == "error"
                    assert set(error) == {"type", "message"}
                else:
                    assert set(error) == {"type", "code", "message", "param"}
                for secret in (right, other, wrong):
                    assert secret not in response.text
            if status == 401:
                assert response.headers["www-authenticate"] == "Bearer"
                assert error["type"] == "authentication_error"
            if status == 403:
                assert error["type"] == "permission_error"
                assert error.get("code", "insufficient_scope") == "insufficient_scope"
            if status == 404:
                assert error["type"] == "not_found_error"
    assert len(outcomes) == 4 * len(ops)


def test_a_bad_or_revoked_token_is_401_and_admin_implies_every_scope(world: World) -> None:
    victim_id, victim = world.new_client(["responses:read"])
    for token in ("lmsp_not-a-real-token", victim + "x", "garbage", ""):
        answer = world.http.get("/v1/tasks", headers=world.auth(token))
        assert answer.status_code == 401
    assert world.http.get("/v1/tasks", headers=world.auth(victim)).status_code == 200
    revoked = world.http.delete(f"/v1/clients/{victim_id}", headers=world.auth(world.owner))
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    assert world.http.get("/v1/tasks", headers=world.auth(victim)).status_code == 401
    _, admin = world.new_client(["admin"])
    for method, path, scope in operations(world):
        if scope is not None and method == "GET" and "{" not in path:
            assert send(world, Call(method, path), admin).status_code == 200, path


def test_a_client_lists_only_its_own_tasks(world: World) -> None:
    _, alice = world.new_client(["responses:read", "responses:write"])
    _, bob = world.new_client(["responses:read", "responses:write"])
    mine = world.finished_response(alice)
    listed = world.http.get("/v1/tasks", headers=world.auth(alice)).json()["data"]
    assert [t["id"] for t in listed] == [mine["task"]["id"]]
    assert world.http.get("/v1/tasks", headers=world.auth(bob)).json()["data"] == []
    cursor = world.http.get(
        "/v1/tasks", params={"after": mine["task"]["id"]}, headers=world.auth(bob)
    )
    assert cursor.status_code == 400


def test_the_owner_oversees_every_clients_work(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``admin`` sees, lists and cancels another client's task (and the task objects it
    gets name their client); a client without ``admin`` still gets 404 for it."""
    alice_id, alice = world.new_client(["responses:read", "responses:write"])
    _, bob = world.new_client(["responses:read", "responses:write"])
    finished = world.finished_response(alice)
    monkeypatch.setenv("LMSP_TEST_ENGINE_DELAY", "0.5")  # a task that is still running
    world.http.app.state.lmsp.host.close()  # the next load reads the delay
    made = world.http.post(
        "/v1/responses",
        json={"model": "lmsp-test", "input": "runaway", "background": True},
        headers=world.auth(alice),
    )
    assert made.status_code == 202, made.text
    response_id, task_id = made.json()["id"], made.json()["task"]["id"]

    # bob, not an admin: nothing of alice's
    for method, path in [
        ("GET", f"/v1/tasks/{task_id}"),
        ("GET", f"/v1/responses/{response_id}"),
        ("POST", f"/v1/tasks/{task_id}/cancel"),
        ("POST", f"/v1/responses/{response_id}/cancel"),
    ]:
        answer = world.http.request(method, path, headers=world.auth(bob))
        assert answer.status_code == 404, (method, path, answer.text)
    filtered = world.http.get("/v1/tasks", params={"client_id": alice_id}, headers=world.auth(bob))
    assert filtered.status_code == 403
    assert filtered.json()["error"]["code"] == "insufficient_scope"
    assert world.http.get("/v1/tasks", headers=world.auth(bob)).json()["data"] == []
    own = world.http.get("/v1/tasks", headers=world.auth(alice)).json()["data"]
    assert {t["id"] for t in own} == {task_id, finished["task"]["id"]}
    assert all("client_id" not in t for t in own)  # a client is not told its own id

    # the owner lists every client's tasks, with their client, or one client's
    owner = world.auth(world.owner)
    listed = world.http.get("/v1/tasks", headers=owner).json()["data"]
    mine = {t["id"]: t for t in listed}
    assert mine[task_id]["client_id"] == alice_id
    assert mine[finished["task"]["id"]]["client_id"] == alice_id
    only = world.http.get("/v1/tasks", params={"client_id": alice_id}, headers=owner).json()
    assert [t["id"] for t in only["data"]] == [task_id, finished["task"]["id"]]
    paged = world.http.get(
        "/v1/tasks", params={"client_id": alice_id, "after": task_id}, headers=owner
    ).json()
    assert [t["id"] for t in paged["data"]] == [finished["task"]["id"]]
    seen = world.http.get(f"/v1/tasks/{task_id}", headers=owner)
    assert seen.status_code == 200 and seen.json()["client_id"] == alice_id
    assert world.http.get(f"/v1/responses/{response_id}", headers=owner).status_code == 200
    log = world.http.get(
        f"/v1/tasks/{task_id}/events", headers={**owner, "Accept": "application/json"}
    )
    assert log.status_code == 200 and log.json()["data"][0]["type"] == "response.created"

    # and stops it
    cancelled = world.http.post(f"/v1/tasks/{task_id}/cancel", headers=owner)
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] in {"cancelling", "cancelled"}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = world.http.get(f"/v1/responses/{response_id}", headers=world.auth(alice)).json()
        if state["status"] == "cancelled":
            break
        time.sleep(0.05)
    assert state["status"] == "cancelled"
    # a finished response of another client can be deleted by the owner too
    gone = world.http.delete(f"/v1/responses/{finished['id']}", headers=owner)
    assert gone.status_code == 200, gone.text
    missing = world.http.get(f"/v1/responses/{finished['id']}", headers=world.auth(alice))
    assert missing.status_code == 404
