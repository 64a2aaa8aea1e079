"""Issue 37, step 1 (the typed request): hostile create bodies on every API that makes
one, against a real server.

Generated: bodies for ``/v1/responses``, ``/v1/chat/completions``, ``/v1/completions``
and ``/v1/messages`` whose ``tools`` hold every kind (functions with odd names and
schemas, namespaces, hosted tools, MCP servers anywhere, ``custom``, unknown types,
non-objects), whose ``tool_choice`` takes every form (and forms of none), whose input
items are of every type (messages of any role and part, function calls with repeated
call ids, outputs, ``additional_tools``, MCP items, forged compactions, non-objects),
with text formats, sampling numbers and stop strings in and out of bounds. No answer may
be a 5xx or lack its API's error shape; a refused create writes nothing; an accepted one
writes exactly one response whose stored request reads back as the same typed request
and is stored again byte for byte; every accepted task finishes.

``make test`` runs a short pass; ``make torture`` (``LMSP_CAMPAIGN=long``) 400 bodies.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmsp.protocol import request as stored
from tests.campaigns.invariants import long_run, report, wait_all_finished
from tests.helpers import Server, open_db

pytestmark = pytest.mark.slow

BODIES = 400 if long_run() else 30
TEST = "lmsp-test"

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)
NAME = st.sampled_from(["f", "weather", "a-b_c", "", "x" * 65, "bad name", "ns.f", "é"])
SCHEMA = st.one_of(
    st.just({"type": "object", "properties": {"a": {"type": "string"}}}),
    st.just({"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}),
    st.just({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}),
    st.just({"type": "string"}),
    JSON,
)
FUNCTION = st.fixed_dictionaries(
    {"type": st.just("function"), "name": NAME},
    optional={"parameters": SCHEMA, "strict": st.booleans() | JSON, "description": JSON},
)
TOOL = st.one_of(
    FUNCTION,
    st.fixed_dictionaries(
        {"type": st.just("namespace"), "name": NAME, "tools": st.lists(FUNCTION, max_size=3)}
    ),
    st.sampled_from(["web_search", "file_search", "custom", "code_interpreter", "nope", ""]).map(
        lambda kind: {"type": kind}
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("mcp"),
            "server_label": st.sampled_from(["s", "a b", ""]),
            "server_url": st.sampled_from(
                ["http://127.0.0.1:9/mcp", "http://example.invalid/", "file:///etc/passwd", ""]
            ),
        },
        optional={
            "headers": st.dictionaries(st.sampled_from(["X-Token", "Bad\n"]), st.text(max_size=5)),
            "allowed_tools": st.lists(NAME, max_size=2) | JSON,
            "require_approval": st.sampled_from(["always", "never", "sometimes"]) | JSON,
        },
    ),
    JSON,
)
CHOICE = st.one_of(
    st.sampled_from(["none", "auto", "required", "any", ""]),
    st.fixed_dictionaries({"type": st.just("function"), "name": NAME}),
    st.fixed_dictionaries(
        {
            "type": st.just("allowed_tools"),
            "mode": st.sampled_from(["none", "auto", "required", "x"]),
            "tools": st.lists(st.fixed_dictionaries({"type": st.just("function"), "name": NAME})),
        }
    ),
    st.fixed_dictionaries({"type": st.just("mcp"), "server_label": st.just("s")}),
    JSON,
)
PART = st.one_of(
    st.fixed_dictionaries({"type": st.just("input_text"), "text": st.text(max_size=20)}),
    st.fixed_dictionaries({"type": st.just("output_text"), "text": st.text(max_size=20)}),
    st.fixed_dictionaries(
        {
            "type": st.just("input_file"),
            "filename": st.sampled_from(["a.txt", "b.pdf", "c.exe", ""]),
            "file_data": st.sampled_from(["data:text/plain;base64,aGk=", "aGk=", "%%%", ""]),
        }
    ),
    st.fixed_dictionaries({"type": st.just("input_image"), "image_url": st.just("x")}),
    JSON,
)
ITEM = st.one_of(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant", "system", "developer", "tool", ""]),
            "content": st.text(max_size=30) | st.lists(PART, max_size=3),
        },
        optional={"type": st.just("message"), "id": st.text(max_size=6)},
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("function_call"),
            "call_id": st.sampled_from(["c1", "c2", ""]),
            "name": NAME,
            "arguments": st.sampled_from(["{}", "{", '{"a": 1}']) | JSON,
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("function_call_output"),
            "call_id": st.sampled_from(["c1", "c3"]),
            "output": st.text(max_size=20) | JSON,
        }
    ),
    st.fixed_dictionaries({"type": st.just("additional_tools"), "tools": st.lists(TOOL)}),
    st.fixed_dictionaries(
        {"type": st.just("compaction"), "encrypted_content": st.text(max_size=30)}
    ),
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(["mcp_list_tools", "mcp_call", "mcp_approval_response"]),
            "server_label": st.just("s"),
        },
        optional={"tools": JSON, "approve": JSON, "approval_request_id": JSON, "name": NAME},
    ),
    JSON,
)
COMMON = {
    "temperature": st.floats(-1, 3, allow_nan=False) | JSON,
    "top_p": st.floats(-1, 2, allow_nan=False),
    "seed": st.integers(-2, 2**40),
    "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=6),
    "stream": st.booleans(),
}


def _responses() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "model": st.just(TEST),
            "input": st.text(min_size=1, max_size=20) | st.lists(ITEM, min_size=1, max_size=5),
            "max_output_tokens": st.integers(1, 4),
        },
        optional={
            **COMMON,
            "tools": st.lists(TOOL, max_size=4) | JSON,
            "tool_choice": CHOICE,
            "text": st.fixed_dictionaries(
                {"format": st.just({"type": "json_object"}) | JSON},
                optional={"verbosity": st.sampled_from(["low", "high", "x"])},
            ),
            "parallel_tool_calls": st.booleans() | JSON,
            "max_tool_calls": st.integers(-1, 3),
            "truncation": st.sampled_from(["auto", "disabled", "x"]),
            "background": st.booleans(),
            "store": st.booleans(),
            "include": st.lists(st.text(max_size=10), max_size=2),
            "metadata": st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
        },
    )


def _chat() -> st.SearchStrategy[dict[str, Any]]:
    message = st.fixed_dictionaries(
        {
            "role": st.sampled_from(["system", "user", "assistant", "tool", "developer", "x"]),
            "content": st.text(max_size=20) | st.lists(PART, max_size=2) | st.none(),
        },
        optional={"tool_call_id": st.just("c1"), "tool_calls": JSON, "name": NAME},
    )
    return st.fixed_dictionaries(
        {
            "model": st.just(TEST),
            "messages": st.lists(message, min_size=1, max_size=4),
            "max_tokens": st.integers(1, 4),
        },
        optional={
            **COMMON,
            "tools": st.lists(
                st.fixed_dictionaries({"type": st.just("function"), "function": FUNCTION}) | TOOL,
                max_size=3,
            ),
            "tool_choice": CHOICE,
            "response_format": JSON,
            "n": st.integers(0, 2),
        },
    )


def _completions() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"model": st.just(TEST), "prompt": st.text(max_size=20) | JSON, "max_tokens": st.just(3)},
        optional={**COMMON, "echo": st.booleans(), "suffix": st.text(max_size=3)},
    )


def _messages() -> st.SearchStrategy[dict[str, Any]]:
    message = st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant", "system"]),
            "content": st.text(max_size=20) | st.lists(JSON, max_size=2),
        }
    )
    return st.fixed_dictionaries(
        {
            "model": st.just(TEST),
            "messages": st.lists(message, min_size=1, max_size=4),
            "max_tokens": st.integers(1, 4),
        },
        optional={
            "system": st.text(max_size=10) | JSON,
            "tools": st.lists(
                st.fixed_dictionaries({"name": NAME, "input_schema": SCHEMA}) | JSON, max_size=3
            ),
            "tool_choice": JSON,
            "stop_sequences": st.lists(st.text(max_size=4), max_size=3),
            "temperature": st.floats(-1, 2, allow_nan=False),
            "stream": st.booleans(),
        },
    )


def _plausible() -> st.SearchStrategy[dict[str, Any]]:
    """Bodies the test engine can run: tools offered to none, items well formed."""
    tool = st.fixed_dictionaries(
        {"type": st.just("function"), "name": st.sampled_from(["f", "g", "weather"])},
        optional={"parameters": st.just({"type": "object", "properties": {}})},
    )
    item = st.one_of(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "assistant", "developer"]), "content": st.text()}
        ),
        st.just({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}),
        st.just({"type": "function_call_output", "call_id": "c1", "output": "ok"}),
    )
    return st.fixed_dictionaries(
        {
            "model": st.just(TEST),
            "input": st.lists(item, min_size=1, max_size=4),
            "max_output_tokens": st.integers(1, 4),
        },
        optional={
            **COMMON,
            "tools": st.lists(tool, max_size=3, unique_by=lambda t: t["name"]),
            "tool_choice": st.just("none"),
            "background": st.booleans(),
            "truncation": st.sampled_from(["auto", "disabled"]),
            "metadata": st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
            "top_k": st.integers(0, 50),
        },
    )


BODY = st.one_of(
    _plausible().map(lambda body: ("/v1/responses", body)),
    _responses().map(lambda body: ("/v1/responses", body)),
    _chat().map(lambda body: ("/v1/chat/completions", body)),
    _completions().map(lambda body: ("/v1/completions", body)),
    _messages().map(lambda body: ("/v1/messages", body)),
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(
        tmp_path_factory.mktemp("round4-request") / "data",
        env={"LMSP_TEST_ENGINE_DELAY": "0"},
    )
    srv.start()
    yield srv
    srv.stop()


def _shape_ok(path: str, answer: httpx.Response) -> bool:
    """Section 8's error shape (Anthropic's on ``/v1/messages``)."""
    try:
        found = answer.json()
    except ValueError:
        return False
    if path == "/v1/messages":
        return found.get("type") == "error" and {"type", "message"} <= set(found["error"])
    return set(found.get("error", {})) == {"type", "code", "message", "param"}


class Campaign:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.statuses: dict[int, int] = {}
        self.bad: list[str] = []
        self.accepted = 0
        self.checked_rows = 0

    def rows(self) -> list[tuple[str, str]]:
        conn = open_db(self.server.data_dir)
        try:
            return [(r[0], r[1]) for r in conn.execute("SELECT id, request FROM responses")]
        finally:
            conn.close()

    def send(self, http: httpx.Client, path: str, body: dict[str, Any]) -> None:
        before = {ident for ident, _ in self.rows()}
        with http.stream("POST", path, json=body) as answer:
            answer.read()
        code = answer.status_code
        self.statuses[code] = self.statuses.get(code, 0) + 1
        new = [(ident, text) for ident, text in self.rows() if ident not in before]
        where = f"{path} {str(body)[:160]}"
        if code >= 500:
            self.bad.append(f"{where}: {code} {answer.text[:200]}")
        elif code >= 400:
            if not _shape_ok(path, answer):
                self.bad.append(f"{where}: error shape {answer.text[:200]}")
            if new:
                self.bad.append(f"{where}: refused ({code}) but wrote {len(new)} response(s)")
        else:
            self.accepted += 1
            if len(new) != 1:
                self.bad.append(f"{where}: accepted, wrote {len(new)} responses")
            for ident, text in new:
                self.reads_back(ident, text)

    def reads_back(self, ident: str, text: str) -> None:
        """The stored request is a typed request, stored again byte for byte."""
        self.checked_rows += 1
        try:
            again = stored.dumps(stored.loads(text))
        except Exception as exc:  # any failure to read it is the violation
            self.bad.append(f"{ident}: its stored request does not read back: {exc!r}")
            return
        if again != text:
            self.bad.append(f"{ident}: stored {text[:200]}, read back as {again[:200]}")


def _crashed(server: Server) -> list[str]:
    """Tasks the runner failed on an exception of its own (a request it could not read,
    say): the test engine never fails."""
    conn = open_db(server.data_dir)
    try:
        rows = conn.execute(
            "SELECT id, error_message FROM tasks WHERE status = 'failed'"
            " AND error_code = 'engine_error'"
        ).fetchall()
    finally:
        conn.close()
    return [f"task {row[0]} failed: {row[1]}" for row in rows]


def test_round4_typed_request_campaign(server: Server) -> None:
    started = time.monotonic()
    campaign = Campaign(server)

    @given(case=BODY)
    @settings(
        max_examples=BODIES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    def run(case: tuple[str, dict[str, Any]]) -> None:
        path, body = case
        with server.client(timeout=300) as http:
            campaign.send(http, path, body)

    run()
    bad = campaign.bad
    if not wait_all_finished(server.data_dir, timeout=600):
        bad.append("tasks left unfinished")
    bad.extend(_crashed(server))
    report(
        f"round-4 typed-request campaign: {sum(campaign.statuses.values())} hostile creates in"
        f" {time.monotonic() - started:.0f}s (statuses {dict(sorted(campaign.statuses.items()))});"
        f" {campaign.accepted} accepted, {campaign.checked_rows} stored requests read back;"
        f" {len(bad)} violations"
    )
    assert not bad, bad[:10]
