"""Where lmsp calls out, against real ``lmsp serve`` processes and real peers on loopback
(issue 36, items 2, 5 and 11b):

- one client's 32 webhooks to a receiver that never answers do not hold up another
  client's webhook (the issue's bound: delivered within 2 s; asserted at 5 s, measured
  and printed);
- a webhook's or an MCP server's host is read as the resolver reads it: every numeric
  form of a link-local address is refused under ``*``, and every numeric form of a
  loopback address is loopback (delivered to the receiver it names, and an MCP server's
  tools listed through it);
- ``POST /v1/webhook_endpoints/{id}/test`` and the deliveries list tell a client that is
  not ``admin`` nothing that tells a closed port from an open one (the same answer, at
  the same time), and tell the operator what happened.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lmsp.outbound import deliverer as sender
from lmsp.store.webhooks import UNDISCLOSED
from tests.helpers import Server, free_port, open_db, seeded_data_dir, served
from tests.test_mcp_tools import McpServer
from tests.webhook_receiver import Babbler, Dead, Delivery, Receiver

pytestmark = pytest.mark.slow

EVENTS = ["response.completed"]
#: the issue's bound on another client's delivery while one client's receivers are dead,
#: and the generous one asserted here (the machine is shared; the figure is printed)
BOUND = 2.0
ASSERTED = 5.0
#: 169.254.169.254 (a cloud's metadata service) as the resolver reads it, in every form
LINK_LOCAL = (
    "2852039166",
    "0xa9fea9fe",
    "0xa9.0xfe.0xa9.0xfe",
    "0251.0376.0251.0376",
    "169.254.43518",
    "169.16689662",
    "0xA9.254.0251.254",
    "169.254.169.254.",
    "[::ffff:169.254.169.254]",
    "[::ffff:a9fe:a9fe]",
    "[::a9fe:a9fe]",
    "[64:ff9b::a9fe:a9fe]",
    "[2002:a9fe:a9fe::1]",
    "[fe80::1]",
)
#: 127.0.0.1 in the forms the resolver takes
LOOPBACK = ("2130706433", "0x7f000001", "0177.0.1", "127.1", "0x7f.1", "[::ffff:7f00:1]")
#: hosts that are not loopback (refused without LMSP_WEBHOOK_HOSTS), or no address
#: at all (four decimal parts with a leading zero: octal to some readers, decimal to
#: others)
ELSEWHERE = ("167772161", "0xc0a80001", "10.1", "[::ffff:a00:1]", "0177.0.0.1", "127.0.0.256")


def new_client(server: Server, name: str) -> str:
    with server.client() as owner:
        made = owner.post(
            "/v1/clients", json={"name": name, "scopes": ["responses:read", "responses:write"]}
        )
        assert made.status_code == 201, made.text
        token: str = made.json()["token"]
        return token


def as_client(server: Server, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=120
    )


def add_hook(http: httpx.Client, url: str) -> dict[str, Any]:
    answer = http.post("/v1/webhooks", json={"url": url, "events": EVENTS})
    assert answer.status_code == 201, answer.text
    hook: dict[str, Any] = answer.json()
    return hook


def respond(http: httpx.Client, text: str) -> str:
    answer = http.post("/v1/responses", json={"model": "lmsp-test", "input": text})
    assert answer.status_code == 200, answer.text
    response_id: str = answer.json()["id"]
    return response_id


def about(delivery: Delivery, response_id: str) -> bool:
    return bool(json.loads(delivery.body)["data"]["id"] == response_id)


def wait(check: Any, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, "never came"
        time.sleep(0.02)
    return got


# -- item 2: fair between clients --------------------------------------------------------------
def test_one_clients_dead_receivers_do_not_hold_up_another_clients_webhook(
    tmp_path: Path,
) -> None:
    dead, ear = Dead().start(), Receiver().start()
    try:
        with (
            served(tmp_path / "data") as server,
            as_client(server, new_client(server, "hostile")) as hostile,
            as_client(server, new_client(server, "bystander")) as bystander,
        ):
            for n in range(32):
                add_hook(hostile, f"{dead.url}?{n}")
            for n in range(8):  # 256 deliveries to a receiver that never answers
                respond(hostile, f"tiny {n}")
            wait(lambda: dead.accepted >= sender.PER_CLIENT)  # its share is in flight
            hook = add_hook(bystander, ear.url)
            waited: list[float] = []
            for n in range(5):
                made = respond(bystander, f"mine {n}")
                ear.wait_for(lambda got, made=made: any(about(d, made) for d in got), 120)
                (delivery,) = [d for d in ear.received() if about(d, made)]
                rows = bystander.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["data"]
                (row,) = [r for r in rows if r["response_id"] == made]
                waited.append(delivery.at - row["created_at"])
            held = dead.accepted
        print(
            f"\nanother client's webhook with 32 dead receivers of one client: "
            f"{', '.join(f'{w:.3f}' for w in waited)} s (bound {BOUND} s);"
            f" the dead receiver took {held} connections"
        )
        assert max(waited) <= ASSERTED, waited
    finally:
        dead.stop()
        ear.stop()


# -- item 5: numeric hosts ---------------------------------------------------------------------
def test_numeric_hosts_name_the_addresses_the_resolver_reads(tmp_path: Path) -> None:
    with served(tmp_path / "wide", env={"LMSP_WEBHOOK_HOSTS": "*"}) as server:
        with server.client() as http:
            for host in LINK_LOCAL:
                url = f"http://{host}/latest/meta-data/"
                refused = http.post("/v1/webhooks", json={"url": url, "events": EVENTS})
                assert refused.status_code == 400, (host, refused.text)
                error = refused.json()["error"]
                assert error["code"] == "invalid_webhook_url" and error["param"] == "url"
        with open_db(server.data_dir) as conn:
            assert conn.execute("SELECT count(*) FROM webhooks").fetchone()[0] == 0
    ear = Receiver().start()
    try:
        with served(tmp_path / "narrow") as server, server.client() as http:
            hooks = {
                host: add_hook(http, f"http://{host}:{ear.port}/hook?{host}") for host in LOOPBACK
            }
            for host in ELSEWHERE:
                url = f"http://{host}:{ear.port}/hook"
                refused = http.post("/v1/webhooks", json={"url": url, "events": EVENTS})
                assert refused.json()["error"]["code"] == "invalid_webhook_url", host
            made = respond(http, "hello")
            ear.wait_for(lambda got: len(got) >= len(LOOPBACK))
            heard = {d.path.partition("?")[2]: d for d in ear.received()}
            assert set(heard) == set(LOOPBACK)
            assert all(about(d, made) for d in heard.values())
            for hook in hooks.values():
                path = f"/v1/webhooks/{hook['id']}/deliveries"
                wait(
                    lambda p=path: (
                        [r["status"] for r in http.get(p).json()["data"]] == ["delivered"]
                    )
                )
    finally:
        ear.stop()


def mcp_request(url: str) -> dict[str, Any]:
    return {
        "model": "smollm2-135m-instruct",
        "input": "hi",
        "tools": [
            {
                "type": "mcp",
                "server_label": "ledger",
                "server_url": url,
                "require_approval": "never",
            }
        ],
        "max_output_tokens": 4,
    }


def test_mcp_server_urls_follow_the_same_reading(tmp_path: Path, blob_cache: Path) -> None:
    wide = seeded_data_dir(tmp_path / "wide", blob_cache)
    with served(wide, env={"LMSP_MCP_HOSTS": "*"}) as server:
        with server.client() as http:
            for host in LINK_LOCAL:
                refused = http.post(
                    "/v1/responses",
                    json={**mcp_request(f"http://{host}/mcp"), "background": True},
                )
                assert refused.status_code == 400, (host, refused.text)
                assert refused.json()["error"]["code"] == "invalid_mcp_server"
        with open_db(server.data_dir) as conn:
            assert conn.execute("SELECT count(*) FROM responses").fetchone()[0] == 0
    tools = McpServer(tmp_path)
    try:
        # the MCP client connects through the same guard: a loopback name, resolved and
        # admitted (the SDK's server checks the Host header: no numeric form here)
        narrow = seeded_data_dir(tmp_path / "narrow", blob_cache)
        with served(narrow) as server, server.client(timeout=300) as http:
            answer = http.post(
                "/v1/responses", json=mcp_request(f"http://localhost:{tools.port}/mcp")
            )
            assert answer.status_code == 200, answer.text
            (listed,) = [i for i in answer.json()["output"] if i["type"] == "mcp_list_tools"]
            assert listed.get("error") is None, listed
            assert "record" in {t["name"] for t in listed["tools"]}
    finally:
        tools.stop()


# -- item 11b: the test endpoint is no port probe ----------------------------------------------
@pytest.fixture
def ports() -> Iterator[dict[str, str]]:
    """A URL on a port of each kind: closed, a receiver that refuses (503), one that
    never answers, one that is not HTTP."""
    refusing, dead, babbler = Receiver(refuse=10**6).start(), Dead().start(), Babbler()
    try:
        yield {
            "closed": f"http://127.0.0.1:{free_port()}/hook",
            "refusing": refusing.url,
            "dead": dead.url,
            "not http": f"http://127.0.0.1:{babbler.port}/hook",
        }
    finally:
        refusing.stop()
        dead.stop()
        babbler.stop()


def test_a_webhook_test_tells_a_client_nothing_of_a_port(
    tmp_path: Path, ports: dict[str, str]
) -> None:
    ear = Receiver().start()
    try:
        with (
            served(tmp_path / "data") as server,
            as_client(server, new_client(server, "prober")) as prober,
            server.client() as op,
        ):
            hooks = {
                kind: prober.post(
                    "/v1/webhook_endpoints", json={"name": kind, "url": url, "event_types": EVENTS}
                ).json()["id"]
                for kind, url in ports.items()
            }
            answers: dict[str, tuple[int, Any, float]] = {}

            def probe(kind: str) -> None:
                began = time.monotonic()
                got = prober.post(
                    f"/v1/webhook_endpoints/{hooks[kind]}/test",
                    json={"event_type": "response.completed"},
                )
                answers[kind] = (got.status_code, got.json(), time.monotonic() - began)

            threads = [threading.Thread(target=probe, args=(k,)) for k in hooks]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            statuses = {status for status, _, _ in answers.values()}
            bodies = {json.dumps(body, sort_keys=True) for _, body, _ in answers.values()}
            assert statuses == {400} and len(bodies) == 1, answers
            assert json.loads(bodies.pop())["error"]["code"] == "webhook_unreachable"
            # the same time too: a refused connection waits as long as a silent port
            assert min(took for _, _, took in answers.values()) >= sender.TEST_TIMEOUT
            # the operator is told what happened
            said = op.post(
                f"/v1/webhook_endpoints/{hooks['refusing']}/test",
                json={"event_type": "response.completed"},
            )
            assert said.status_code == 400 and "it answered 503" in said.text
            # a receiver that accepts: its status, for anyone
            good = prober.post(
                "/v1/webhook_endpoints",
                json={"name": "good", "url": ear.url, "event_types": EVENTS},
            ).json()["id"]
            ok = prober.post(
                f"/v1/webhook_endpoints/{good}/test", json={"event_type": "response.completed"}
            )
            assert ok.status_code == 200 and ok.json()["status_code"] == 200, ok.text
            # a real delivery's failed tries: the operator sees why, the client not
            respond(prober, "hello")
            path = f"/v1/webhooks/{hooks['refusing']}/deliveries"
            rows = wait(lambda: [r for r in prober.get(path).json()["data"] if r["last_error"]])
            assert rows[0]["last_error"] == UNDISCLOSED
            assert rows[0]["last_status_code"] is None
            seen = op.get(path).json()["data"][0]
            assert seen["last_error"] == "HTTP 503" and seen["last_status_code"] == 503
    finally:
        ear.stop()
