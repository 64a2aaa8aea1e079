"""Issue 37's clean-up of repeated code (helper "dups"): the refusals it made one, under
hostile bodies against a real server, counting violations and printing its figures.

- **Fields lmsp has not** (``api/schemas.Unavailable``): Responses, Chat Completions and
  Messages bodies carrying any set of their API's fields lmsp does not have, with any
  JSON value (``null`` included). A body with one set is ``400 unsupported_parameter``
  naming the first declared of them (Messages: Anthropic's error shape naming it) and
  writes nothing; a body whose such fields are all ``null`` is answered as without them.
- **Fields an input item has not** (``protocol/fields.only_fields``): input items of
  every kind (messages, function calls and outputs, compactions, MCP items) with one
  field their kind does not have: ``400 unsupported_parameter`` naming
  ``input.N.field``, nothing written.

``make test``: 40 bodies; ``make torture`` (``LMSP_CAMPAIGN=long``): 400.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.test_unavailable_fields import CHAT, MESSAGES, RESPONSES
from tests.campaigns.invariants import long_run, report, wait_all_finished
from tests.helpers import Server, open_db

pytestmark = pytest.mark.slow

BODIES = 400 if long_run() else 40
TEST = "lmsp-test"

#: each API's fields lmsp does not have, in declared order (the first set is named)
UNAVAILABLE = {
    "/v1/responses": RESPONSES,
    "/v1/chat/completions": CHAT,
    "/v1/messages": MESSAGES,
}
BASE: dict[str, dict[str, Any]] = {
    "/v1/responses": {"model": TEST, "input": "hi", "max_output_tokens": 2},
    "/v1/chat/completions": {
        "model": TEST,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    },
    "/v1/messages": {
        "model": TEST,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    },
}
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=6,
)
#: input items of every kind, each well formed but for the field added to it
ITEMS: tuple[dict[str, Any], ...] = (
    {"type": "message", "role": "user", "content": "hi"},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    {"type": "compaction", "encrypted_content": "x"},
    {"type": "mcp_call", "server_label": "s", "name": "t", "arguments": "{}"},
    {"type": "mcp_approval_request", "server_label": "s", "name": "t", "arguments": "{}"},
    {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": False},
    {"type": "mcp_list_tools", "server_label": "s", "tools": []},
)
STRANGER = st.sampled_from(["colour", "lmsp_text", "Type", "arguments_", "x" * 40])


@st.composite
def unavailable_case(draw: st.DrawFn) -> tuple[str, dict[str, Any], str | None]:
    """(path, body, the field that must be named or ``None`` for an accepted body)."""
    path = draw(st.sampled_from(sorted(UNAVAILABLE)))
    names = draw(st.lists(st.sampled_from(UNAVAILABLE[path]), min_size=1, max_size=3))
    given = {name: draw(JSON) for name in names}
    named = next((n for n in UNAVAILABLE[path] if given.get(n) is not None), None)
    return path, {**BASE[path], **given}, named


@st.composite
def item_case(draw: st.DrawFn) -> tuple[str, dict[str, Any], str | None]:
    item = dict(draw(st.sampled_from(ITEMS)))
    stranger = draw(STRANGER)
    item[stranger] = draw(JSON.filter(lambda v: v is not None))
    before = draw(st.integers(0, 1))
    given = [{"role": "user", "content": "first"}] * before + [item]
    body = {**BASE["/v1/responses"], "input": given}
    return "/v1/responses", body, f"input.{before}.{stranger}"


CASE = st.one_of(unavailable_case(), item_case())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(
        tmp_path_factory.mktemp("round4-dups") / "data", env={"LMSP_TEST_ENGINE_DELAY": "0"}
    )
    srv.start()
    yield srv
    srv.stop()


def _responses(server: Server) -> int:
    conn = open_db(server.data_dir)
    try:
        return int(conn.execute("SELECT count(*) FROM responses").fetchone()[0])
    finally:
        conn.close()


def _names(path: str, answer: httpx.Response, field: str) -> bool:
    """The refusal names ``field`` in its API's error shape."""
    try:
        found = answer.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    if path == "/v1/messages":
        return found.get("type") == "invalid_request_error" and field in found.get("message", "")
    return found.get("code") == "unsupported_parameter" and found.get("param") == field


class Campaign:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.statuses: dict[int, int] = {}
        self.refused = 0
        self.accepted = 0
        self.bad: list[str] = []

    def send(self, http: httpx.Client, path: str, body: dict[str, Any], named: str | None) -> None:
        before = _responses(self.server)
        answer = http.post(path, json=body)
        code = answer.status_code
        self.statuses[code] = self.statuses.get(code, 0) + 1
        wrote = _responses(self.server) - before
        where = f"{path} {str(body)[:160]}"
        if named is None:
            self.accepted += 1
            if code != 200 or wrote != 1:
                self.bad.append(f"{where}: {code} {answer.text[:160]}, wrote {wrote}, not accepted")
            return
        self.refused += 1
        if code != 400 or not _names(path, answer, named):
            self.bad.append(f"{where}: {code} {answer.text[:200]}, not a refusal of {named}")
        if wrote:
            self.bad.append(f"{where}: refused but wrote {wrote} response(s)")


def test_round4_dups_refusals(server: Server) -> None:
    started = time.monotonic()
    campaign = Campaign(server)

    @given(case=CASE)
    @settings(
        max_examples=BODIES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    def run(case: tuple[str, dict[str, Any], str | None]) -> None:
        with server.client(timeout=300) as http:
            campaign.send(http, *case)

    run()
    bad = campaign.bad
    if not wait_all_finished(server.data_dir, timeout=600):
        bad.append("tasks left unfinished")
    report(
        f"round-4 dups: {sum(campaign.statuses.values())} hostile bodies in"
        f" {time.monotonic() - started:.0f}s (statuses {dict(sorted(campaign.statuses.items()))});"
        f" {campaign.refused} to refuse, {campaign.accepted} to accept; {len(bad)} violations"
    )
    assert not bad, bad[:10]
