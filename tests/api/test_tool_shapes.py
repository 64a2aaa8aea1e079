"""Tool definitions and ``tool_choice``, one reading for both APIs, through the real
server (issue 17, finding 5): every shape the red-team probe sent (500s before) is a
``400`` naming its ``param`` in the caller's own spelling, Chat refuses the names
``/v1/responses`` refuses, and nothing is written. Hypothesis then replaces one leaf of
a valid tool or choice, in either dialect, with any JSON value: the answer is never a
5xx, and a refusal names the replaced place (or a place inside it)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.helpers import Server, open_db, seeded_data_dir

pytestmark = pytest.mark.slow

# the bundled model: a tool choice is a grammar, which the test engine cannot follow
MODEL = "smollm2-135m-instruct"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
RESPONSES = {"model": MODEL, "input": "hi", "max_output_tokens": 2}
CHAT_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
RESPONSES_TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, blob_cache: Path) -> Iterator[Server]:
    data_dir = seeded_data_dir(tmp_path_factory.mktemp("tools") / "data", blob_cache)
    srv = Server(data_dir)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


def written(data_dir: Path) -> int:
    conn = open_db(data_dir)
    try:
        return int(conn.execute("SELECT count(*) FROM responses").fetchone()[0])
    finally:
        conn.close()


#: (path, extra body fields, the param the refusal must name)
FINDINGS: list[tuple[str, dict[str, Any], str]] = [
    # the probe's 500s
    ("chat", {"tools": [{"type": "function", "function": {"name": 7}}]}, "tools.0.function.name"),
    (
        "chat",
        {"tools": [CHAT_TOOL], "tool_choice": {"type": "function", "function": "f"}},
        "tool_choice.function",
    ),
    (
        "chat",
        {"tools": [CHAT_TOOL], "tool_choice": {"function": {"name": ["x"]}}},
        "tool_choice.type",
    ),
    (
        "chat",
        {
            "tools": [CHAT_TOOL],
            "tool_choice": {"type": "allowed_tools", "allowed_tools": {"tools": ["x"]}},
        },
        "tool_choice.allowed_tools.tools.0",
    ),
    (
        "responses",
        {"tools": [RESPONSES_TOOL], "tool_choice": {"type": "allowed_tools", "tools": ["x"]}},
        "tool_choice.tools.0",
    ),
    (
        "responses",
        {"tools": [RESPONSES_TOOL], "tool_choice": {"type": "function", "function": "f"}},
        "tool_choice.name",
    ),
    # names Chat accepted and /v1/responses refused
    ("chat", {"tools": [{"type": "function", "function": {"name": 123}}]}, "tools.0.function.name"),
    (
        "chat",
        {"tools": [{"type": "function", "function": {"name": 'say"hi'}}]},
        "tools.0.function.name",
    ),
    (
        "chat",
        {"tools": [{"type": "function", "function": {"name": "a\nb"}}]},
        "tools.0.function.name",
    ),
    (
        "chat",
        {"tools": [{"type": "function", "function": {"name": "<tool_call>"}}]},
        "tools.0.function.name",
    ),
    ("responses", {"tools": [{"type": "function", "name": "<tool_call>"}]}, "tools.0.name"),
    ("responses", {"tools": [{"type": "function", "name": 123}]}, "tools.0.name"),
    # more shapes of the same kind
    ("chat", {"tools": [{"type": "function", "function": "f"}]}, "tools.0.function"),
    ("chat", {"tools": [{"type": "function"}]}, "tools.0.function"),
    ("chat", {"tools": ["f"]}, "tools.0"),
    ("chat", {"tools": [{"function": {"name": "f"}}]}, "tools.0.type"),
    ("chat", {"tools": [{"type": ["function"], "function": {"name": "f"}}]}, "tools.0.type"),
    (
        "chat",
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
        "tools.0.function.parameters",
    ),
    (
        "chat",
        {"tools": [{"type": "function", "function": {"name": "f", "description": 5}}]},
        "tools.0.function.description",
    ),
    (
        "chat",
        {"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]},
        "tools.0.function.strict",
    ),
    ("chat", {"tools": [CHAT_TOOL], "tool_choice": 3}, "tool_choice"),
    ("chat", {"tools": [CHAT_TOOL], "tool_choice": "sometimes"}, "tool_choice"),
    (
        "chat",
        {"tools": [CHAT_TOOL], "tool_choice": {"type": "function", "function": {"name": "f x"}}},
        "tool_choice.function.name",
    ),
    (
        "chat",
        {"tools": [CHAT_TOOL], "tool_choice": {"type": "allowed_tools", "allowed_tools": "f"}},
        "tool_choice.allowed_tools",
    ),
    (
        "chat",
        {
            "tools": [CHAT_TOOL],
            "tool_choice": {"type": "allowed_tools", "allowed_tools": {"tools": []}},
        },
        "tool_choice.allowed_tools.tools",
    ),
    (
        "chat",
        {
            "tools": [CHAT_TOOL],
            "tool_choice": {
                "type": "allowed_tools",
                "allowed_tools": {"mode": "any", "tools": [CHAT_TOOL]},
            },
        },
        "tool_choice.allowed_tools.mode",
    ),
    (
        "chat",
        {
            "tools": [CHAT_TOOL],
            "tool_choice": {
                "type": "allowed_tools",
                "allowed_tools": {"tools": [{"type": "function", "function": {"name": "g"}}]},
            },
        },
        "tool_choice.allowed_tools.tools.0.function.name",
    ),
    ("chat", {"tools": [CHAT_TOOL, CHAT_TOOL]}, "tools.1.function.name"),
    ("responses", {"tools": ["f"]}, "tools.0"),
    (
        "responses",
        {"tools": [{"type": "function", "name": "f", "parameters": []}]},
        "tools.0.parameters",
    ),
    (
        "responses",
        {"tools": [RESPONSES_TOOL], "tool_choice": {"type": "function", "name": "g"}},
        "tool_choice.name",
    ),
    (
        "responses",
        {
            "tools": [RESPONSES_TOOL],
            "tool_choice": {"type": "allowed_tools", "tools": [{"type": "function"}]},
        },
        "tool_choice.tools.0.name",
    ),
    ("responses", {"tools": [RESPONSES_TOOL], "tool_choice": {"name": "f"}}, "tool_choice.type"),
    ("responses", {"tools": [RESPONSES_TOOL], "tool_choice": [1]}, "tool_choice"),
]


@pytest.mark.parametrize(("api", "extra", "param"), FINDINGS)
def test_every_malformed_tool_shape_is_a_400_naming_its_param(
    server: Server, http: httpx.Client, api: str, extra: dict[str, Any], param: str
) -> None:
    before = written(server.data_dir)
    path, base = ("/v1/chat/completions", CHAT) if api == "chat" else ("/v1/responses", RESPONSES)
    answer = http.post(path, json={**base, **extra})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param, error
    assert error["code"] in ("invalid_value", "unsupported_parameter"), error
    assert written(server.data_dir) == before


def test_valid_tools_still_work_in_both_apis(http: httpx.Client) -> None:
    chat = http.post(
        "/v1/chat/completions",
        json={**CHAT, "tools": [CHAT_TOOL], "tool_choice": "none"},
    )
    assert chat.status_code == 200, chat.text
    choice = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "f"}]}
    answer = http.post(
        "/v1/responses", json={**RESPONSES, "tools": [RESPONSES_TOOL], "tool_choice": choice}
    )
    assert answer.status_code == 200, answer.text
    obj = answer.json()
    assert obj["tools"][0]["name"] == "f" and obj["tool_choice"] == choice


# -- hypothesis: one leaf of a valid shape replaced with any JSON value ----------------------
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.text(max_size=8)
    | st.sampled_from(["function", "f", "g", "auto", "allowed_tools", "<tool_call>"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)

#: valid bodies of each dialect: tools and a choice that exercise every place
VALID = {
    "chat": {
        "tools": [
            CHAT_TOOL,
            {"type": "function", "function": {"name": "g", "description": "d", "strict": False}},
        ],
        "tool_choice": {
            "type": "allowed_tools",
            "allowed_tools": {
                "mode": "auto",
                "tools": [{"type": "function", "function": {"name": "g"}}],
            },
        },
    },
    "chat-named": {
        "tools": [CHAT_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
    },
    "responses": {
        "tools": [
            RESPONSES_TOOL,
            {"type": "function", "name": "g", "description": "d", "strict": False},
        ],
        "tool_choice": {
            "type": "allowed_tools",
            "mode": "auto",
            "tools": [{"type": "function", "name": "g"}],
        },
    },
    "responses-named": {
        "tools": [RESPONSES_TOOL],
        "tool_choice": {"type": "function", "name": "f"},
    },
}


def places(value: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    """Every place in a JSON value (objects' keys and lists' indexes, leaves included)."""
    if path:
        yield path
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from places(inner, (*path, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from places(inner, (*path, index))


def replaced(body: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(body)
    holder: Any = out
    for part in path[:-1]:
        holder = holder[part]
    holder[path[-1]] = value
    return out


@st.composite
def mutations(draw: st.DrawFn) -> tuple[str, tuple[str | int, ...], dict[str, Any]]:
    kind = draw(st.sampled_from(sorted(VALID)))
    body = VALID[kind]
    path = draw(st.sampled_from(list(places(body))))
    return kind, path, replaced(body, path, draw(JSON))


def test_any_leaf_replaced_is_accepted_or_refused_at_its_place(
    server: Server, http: httpx.Client
) -> None:
    seen: list[int] = []

    kept = ("tools", 1, "function", "description")  # a string for a string: accepted
    accepted = ("chat", kept, replaced(VALID["chat"], kept, "another"))

    @given(case=mutations())
    @example(case=accepted)  # both outcomes seen, whatever the draws (all 150 were 400s once)
    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    def run(case: tuple[str, tuple[str | int, ...], dict[str, Any]]) -> None:
        kind, path, extra = case
        api = kind.split("-")[0]
        url, base = (
            ("/v1/chat/completions", CHAT) if api == "chat" else ("/v1/responses", RESPONSES)
        )
        before = written(server.data_dir)
        answer = http.post(url, json={**base, **extra})
        seen.append(answer.status_code)
        assert answer.status_code in (200, 400), (path, extra, answer.text)
        if answer.status_code == 400:
            param = answer.json()["error"]["param"]
            assert written(server.data_dir) == before
            # the place replaced or a place inside it; or, when a type changed, a
            # sibling the new type needs; or a name that a change left unmatched
            place = ".".join(str(p) for p in path)
            parent = ".".join(str(p) for p in path[:-1])
            assert (
                param == place
                or param.startswith(place + ".")
                or (path[-1] == "type" and param.startswith(parent))
                or param.endswith("name")
            ), (path, extra, param)

    run()
    assert 200 in seen and 400 in seen
