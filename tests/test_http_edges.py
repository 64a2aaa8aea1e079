"""The edges of HTTP against a real server (issue 17, finding 6), with either parser
uvicorn can use (httptools, h11):

- header bombs (a 1 MB field, 20,000 fields, 32 MB values, a 70 KB head in one read,
  150 small fields) are answered ``431 request_header_too_large`` and the process's
  resident memory stays where it was;
- ``X-Forwarded-For`` is not believed unless ``LMSP_TRUSTED_PROXIES`` names the peer,
  so a pairing request's ``source`` is the real peer;
- a foreign ``Host`` (a DNS-rebinding page) gets ``421 misdirected_request`` on every
  route, ``/metrics`` and pairing included; ``127.0.0.1`` and ``localhost`` work, and
  ``LMSP_ALLOWED_HOSTS`` adds names;
- several local agents pair at once, while a flood is bounded per client name and in
  all (``429`` with ``Retry-After``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import Server, raw_request, rss_mib, status_of

pytestmark = pytest.mark.slow


def rss(server: Server) -> float:
    assert server.proc is not None
    return rss_mib(server.proc.pid)


def raw(server: Server, head: bytes) -> bytes:
    return raw_request(server.port, head)


def get(target: bytes, *fields: bytes) -> bytes:
    lines = [b"GET " + target + b" HTTP/1.1", b"Host: 127.0.0.1", b"Connection: close", *fields]
    return b"\r\n".join(lines) + b"\r\n\r\n"


@pytest.fixture(scope="module", params=["httptools", "h11"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    srv = Server(
        tmp_path_factory.mktemp(f"edges-{request.param}") / "data",
        env={
            "LMSP_HTTP": request.param,
            "LMSP_ALLOWED_HOSTS": "lmsp.test",
            "LMSP_MAX_PENDING_PAIRINGS": "12",
            "LMSP_MAX_PENDING_PAIRINGS_PER_NAME": "3",
        },
    ).start()
    yield srv
    srv.stop()


BOMBS = {
    "a 1 MB field": get(b"/healthz", b"X-Big: " + b"a" * (1 << 20)),
    "20,000 fields": get(b"/healthz", *(b"X-%d: a" % i for i in range(20_000))),
    "a 32 MB value": get(b"/healthz", b"X-Big: " + b"b" * (32 << 20)),
    "a 70 KB head in one read": get(b"/healthz", b"X-A: " + b"c" * 70_000),
    "a 1 MB request line": get(b"/healthz?" + b"q" * (1 << 20)),
    "150 small fields": get(b"/healthz", *(b"X-%d: a" % i for i in range(150))),
}


def test_header_bombs_get_431_and_memory_stays_bounded(server: Server) -> None:
    assert status_of(raw(server, get(b"/healthz"))) == 200
    before = rss(server)
    for name, bomb in BOMBS.items():
        for _ in range(5 if len(bomb) > 1 << 20 else 2):
            answer = raw(server, bomb)
            assert status_of(answer) == 431, (name, answer[:200])
            assert b'"code":"request_header_too_large"' in answer, (name, answer[-300:])
    # ten bombs at once, each on its own connection
    threads = [
        threading.Thread(target=raw, args=(server, BOMBS["a 32 MB value"])) for _ in range(10)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    grown = rss(server) - before
    assert grown < 64, f"RSS grew by {grown:.0f} MiB"
    # a head just under the limit is served, and the service is well
    fine = get(b"/healthz", *(b"X-%d: %s" % (i, b"d" * 500) for i in range(90)))
    assert status_of(raw(server, fine)) == 200
    assert httpx.get(f"{server.url}/healthz").status_code == 200


def test_a_spoofed_forwarded_for_does_not_change_a_pairings_source(server: Server) -> None:
    made = httpx.post(
        f"{server.url}/v1/pairing",
        json={"client_name": "spoofer"},
        headers={"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "https"},
    )
    assert made.status_code == 201
    assert made.json()["source"] == "127.0.0.1"
    assert made.json()["verification_uri"].startswith(f"{server.url}/")  # not https
    with server.client() as owner:
        owner.delete("/v1/pairing")


@pytest.mark.parametrize("path", ["/metrics", "/healthz", "/", "/v1/service"])
def test_a_foreign_host_is_misdirected(server: Server, path: str) -> None:
    for host in (
        "evil.example",
        f"evil.example:{server.port}",
        "127.0.0.1.nip.io",
        "localhost.evil",
    ):
        answer = httpx.get(f"{server.url}{path}", headers={"Host": host})
        assert answer.status_code == 421, (host, answer.text)
        assert answer.json()["error"]["code"] == "misdirected_request"
    for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}", "lmsp.test", "LOCALHOST"):
        assert httpx.get(f"{server.url}{path}", headers={"Host": host}).status_code == 200, host
    assert httpx.get(f"http://localhost:{server.port}{path}").status_code == 200


def test_a_rebinding_page_cannot_pair(server: Server) -> None:
    answer = httpx.post(
        f"{server.url}/v1/pairing",
        json={"client_name": "rebound"},
        headers={"Host": "evil.example"},
    )
    assert answer.status_code == 421
    with server.client() as owner:
        pending = owner.get("/v1/pairing").json()["data"]
    assert "rebound" not in [p["client_name"] for p in pending]


def test_several_agents_pair_at_once_and_a_flood_is_bounded(server: Server) -> None:
    def ask(name: str) -> httpx.Response:
        return httpx.post(f"{server.url}/v1/pairing", json={"client_name": name})

    # six agents of this machine at once (one loopback address): all get a request
    answers: list[httpx.Response] = []
    threads = [
        threading.Thread(target=lambda n=name: answers.append(ask(n)))
        for name in ("codex", "claude", "aider", "goose", "cline", "zed")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(a.status_code for a in answers) == [201] * 6
    # one name flooding: bounded at three (case and spaces aside)
    flood = [ask(name).status_code for name in ("loop", "LOOP", " loop ", "loop", "loop")]
    assert flood == [201, 201, 201, 429, 429]
    refused = ask("loop")
    assert refused.json()["error"]["code"] == "too_many_pairing_requests"
    assert 1 <= int(refused.headers["retry-after"]) <= 600
    # a flood of names: bounded by the global limit (12), the others' requests stay
    many = [ask(f"flood-{i}").status_code for i in range(10)]
    assert many.count(201) == 3 and many.count(429) == 7
    with server.client() as owner:
        pending = owner.get("/v1/pairing").json()["data"]
        assert len(pending) == 12
        assert {"codex", "claude", "aider", "goose", "cline", "zed"} <= {
            p["client_name"] for p in pending
        }
        owner.delete("/v1/pairing")  # the operator clears them all
    assert ask("codex").status_code == 201
    with server.client() as owner:
        owner.delete("/v1/pairing")


def test_a_trusted_proxy_is_believed(tmp_path: Path) -> None:
    """``LMSP_TRUSTED_PROXIES`` names the peers whose ``X-Forwarded-*`` is believed."""
    server = Server(tmp_path / "data", env={"LMSP_TRUSTED_PROXIES": "127.0.0.1"}).start()
    try:
        made = httpx.post(
            f"{server.url}/v1/pairing",
            json={"client_name": "behind-proxy"},
            headers={"X-Forwarded-For": "198.51.100.4"},
        )
        assert made.status_code == 201 and made.json()["source"] == "198.51.100.4"
    finally:
        server.stop()
