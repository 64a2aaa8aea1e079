"""The routes that take no token refuse a web page's requests (issue 30, item 4), on a
real ``lmsp serve``.

Before: ``POST /v1/pairing`` took ``Content-Type: text/plain`` from ``Origin:
http://evil.com`` (a simple request any page can send without a preflight); 63 of them
filled the global pending limit and a real agent then got ``429`` for ten minutes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import Server, served

pytestmark = pytest.mark.slow

BODY = b'{"client_name": "evil page"}'
PAGE = {"Content-Type": "text/plain;charset=UTF-8", "Origin": "http://evil.com"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with served(Path(tmp_path_factory.mktemp("cross-site")) / "data") as srv:
        yield srv


def code(answer: httpx.Response) -> str:
    return str(answer.json()["error"]["code"])


def test_a_page_cannot_fill_the_pending_pairings(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for _ in range(70):  # more than the global limit (64)
            answer = http.post("/v1/pairing", content=BODY, headers=PAGE)
            assert answer.status_code == 403, answer.text
            assert code(answer) == "cross_site_request"
        agent = http.post("/v1/pairing", json={"client_name": "real agent"})
        assert agent.status_code == 201, agent.text
        pending = server.client().get("/v1/pairing").json()["data"]
        assert [p["client_name"] for p in pending] == ["real agent"]


@pytest.mark.parametrize(
    ("headers", "status", "expected"),
    [
        ({"Content-Type": "text/plain"}, 415, "unsupported_media_type"),
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"),
        ({"Content-Type": "multipart/form-data; boundary=x"}, 415, "unsupported_media_type"),
        ({"Content-Type": "application/json", "Origin": "http://evil.com"}, 403, None),
        ({"Content-Type": "application/json", "Origin": "null"}, 403, None),
        ({"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, 403, None),
        ({"Content-Type": "application/json", "Sec-Fetch-Site": "same-site"}, 403, None),
    ],
)
def test_what_a_browser_sends_cross_site_is_refused(
    server: Server, headers: dict[str, str], status: int, expected: str | None
) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for path in ("/v1/pairing", "/v1/pairing/pair_x/token", "/console/session"):
            answer = http.post(path, content=b'{"client_name": "x", "code": "y"}', headers=headers)
            assert answer.status_code == status, (path, answer.text)
            assert code(answer) == (expected or "cross_site_request")


def test_the_same_origin_and_agents_pass(server: Server) -> None:
    host = server.url.removeprefix("http://")
    with httpx.Client(base_url=server.url, timeout=30) as http:
        same = {"Origin": server.url, "Sec-Fetch-Site": "same-origin", "Host": host}
        made = http.post("/v1/pairing", json={"client_name": "console page"}, headers=same)
        assert made.status_code == 201, made.text
        # a poll with no body passes (nothing to smuggle), and hears the flow's answer
        poll = http.post(f"/v1/pairing/{made.json()['id']}/token")
        assert poll.status_code == 400 and code(poll) == "authorization_pending"
        typed = http.post(
            "/v1/pairing", json={"client_name": "typed"}, headers={"Sec-Fetch-Site": "none"}
        )
        assert typed.status_code == 201, typed.text


def test_peers_beyond_this_machine_cannot_take_every_slot(tmp_path: Path) -> None:
    """Pending pairings are limited per source (4 an address beyond this machine), per
    name, and now for all such peers together (half the global limit): 40 addresses
    cannot lock this machine's agents out."""
    env = {"LMSP_TRUSTED_PROXIES": "127.0.0.1"}  # the test's addresses, as a proxy says
    with served(tmp_path / "data", env) as srv, httpx.Client(base_url=srv.url) as http:
        refused = 0
        for i in range(40):
            answer = http.post(
                "/v1/pairing",
                json={"client_name": f"remote {i}"},
                headers={"X-Forwarded-For": f"198.51.100.{i + 1}"},
            )
            assert answer.status_code in (201, 429), answer.text
            refused += answer.status_code == 429
        assert refused == 40 - 32  # half of LMSP_MAX_PENDING_PAIRINGS (64)
        assert "from beyond this machine" in answer.json()["error"]["message"]
        local = http.post("/v1/pairing", json={"client_name": "local agent"})
        assert local.status_code == 201, local.text
