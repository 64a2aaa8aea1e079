"""The Responses wire surface through the in-process app (deterministic test engine): the
whole response object, stream framing, the field policy, cancel, stop sequences.

Every object and event here is validated against the Open Responses models and the
openai SDK's types (``tests/openresponses.py``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from lmsp.api.app import create_app
from lmsp.config import Settings
from lmsp.protocol import events as ev
from tests.helpers import check_log_invariants
from tests.openresponses import check_event, check_object

BODY: dict[str, Any] = {"model": "lmsp-test", "input": "hello there", "seed": 11}


def raw_stream(client: TestClient, method: str, url: str, **kwargs: Any) -> bytes:
    with client.stream(method, url, **kwargs) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return response.read()


def parse_stream(raw: bytes) -> list[dict[str, Any]]:
    """A responses stream's events, asserting its framing byte by byte."""
    assert b"\r" not in raw
    # keep-alives are lone comment lines, outside any event
    text = "".join(line for line in raw.decode().splitlines(True) if line != ": ping\n")
    assert text.endswith("data: [DONE]\n\n")
    events = []
    for block in text.split("\n\n")[:-2]:
        lines = block.split("\n")
        assert [line.split(":", 1)[0] for line in lines] == ["id", "event", "data"], lines
        event = json.loads(lines[2].removeprefix("data: "))
        assert lines[1] == f"event: {event['type']}"
        assert lines[0] == f"id: {event['sequence_number']}"
        events.append(event)
    return events


def stream(client: TestClient, method: str, url: str, **kwargs: Any) -> list[dict[str, Any]]:
    events = parse_stream(raw_stream(client, method, url, **kwargs))
    for event in events:
        check_event(event)
    return events


def log_of(client: TestClient, task_id: str) -> list[dict[str, Any]]:
    page = client.get(
        f"/v1/tasks/{task_id}/events",
        params={"limit": 1000},
        headers={"Accept": "application/json"},
    )
    return list(page.json()["data"])


def counts(client: TestClient) -> dict[str, int]:
    conn = client.app.state.lmsp.db.reader()  # type: ignore[attr-defined]
    return {
        table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        for table in ("responses", "tasks", "task_events", "idempotency_keys")
    }


def wait_status(client: TestClient, response_id: str, *statuses: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        obj: dict[str, Any] = client.get(f"/v1/responses/{response_id}").json()
        if obj["status"] in statuses:
            return obj
        time.sleep(0.01)
    raise AssertionError(f"{response_id} never reached {statuses}")


def text_of(obj: dict[str, Any]) -> str:
    return "".join(c["text"] for item in obj["output"] for c in item["content"])


# -- the whole object ------------------------------------------------------------------------
def test_every_object_and_event_has_the_whole_shape(client: TestClient) -> None:
    """Sync, background, retrieve, stream (with the lifecycle extensions), an incomplete
    and a failed response: each object and event validates."""
    sync = client.post("/v1/responses", json=BODY).json()
    check_object(sync)
    assert sync["status"] == "completed"
    assert isinstance(sync["completed_at"], int) and sync["completed_at"] >= sync["created_at"]

    queued = client.post("/v1/responses", json={**BODY, "background": True})
    assert queued.status_code == 202
    check_object(queued.json())
    assert queued.json()["completed_at"] is None and queued.json()["usage"] is None
    check_object(wait_status(client, queued.json()["id"], "completed"))

    events = stream(
        client,
        "POST",
        "/v1/responses",
        json={**BODY, "stream": True, "include": ["lmsp.lifecycle"]},
    )
    assert "response.loading" in [e["type"] for e in events]
    assert events[0]["response"]["completed_at"] is None
    assert events[-1]["response"]["completed_at"] is not None

    short = client.post("/v1/responses", json={**BODY, "max_output_tokens": 3}).json()
    check_object(short)
    assert short["status"] == "incomplete" and short["completed_at"] is not None
    assert short["incomplete_details"] == {"reason": "max_output_tokens"}
    assert short["output"][0]["status"] == "incomplete"

    failed = client.post("/v1/responses", json={**BODY, "input": "[engine-error]"}).json()
    check_object(failed)
    assert failed["status"] == "failed" and failed["completed_at"] is None
    assert failed["error"]["code"] == "engine_error"
    for event in log_of(client, failed["task"]["id"]):
        check_event(event)


def test_the_object_echoes_what_was_asked(client: TestClient) -> None:
    tool = {
        "type": "function",
        "name": "lookup",
        "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
    }
    asked = {
        **BODY,
        "instructions": "Answer briefly.",
        "tools": [tool],
        "tool_choice": "none",
        "parallel_tool_calls": False,
        "max_tool_calls": 2,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "temperature": 0.25,
        "top_p": 0.5,
        "max_output_tokens": 40,
        "truncation": "disabled",
        "service_tier": "auto",
        "reasoning": {"effort": "none"},
        "include": ["reasoning.encrypted_content"],
        "metadata": {"job": "7"},
        "safety_identifier": "user-hash-1",
        "prompt_cache_key": "cache-1",
        "user": "agent-9",
    }
    obj = client.post("/v1/responses", json=asked).json()
    check_object(obj)
    assert obj["instructions"] == "Answer briefly."
    assert obj["tools"] == [{**tool, "strict": True}]
    assert obj["tool_choice"] == "none"
    assert obj["parallel_tool_calls"] is False and obj["max_tool_calls"] == 2
    assert obj["text"] == {"format": {"type": "text"}, "verbosity": "medium"}
    assert (obj["temperature"], obj["top_p"]) == (0.25, 0.5)
    assert (obj["presence_penalty"], obj["frequency_penalty"], obj["top_logprobs"]) == (0, 0, 0)
    assert obj["max_output_tokens"] == 40 and obj["truncation"] == "disabled"
    assert obj["service_tier"] == "default"
    assert obj["reasoning"] == {"effort": "none", "summary": None}
    assert obj["metadata"] == {"job": "7"} and obj["user"] == "agent-9"
    assert obj["safety_identifier"] == "user-hash-1" and obj["prompt_cache_key"] == "cache-1"
    assert obj["store"] is True and obj["background"] is False
    assert obj["previous_response_id"] is None
    usage = obj["usage"]
    assert usage["input_tokens_details"]["cached_tokens"] == 0
    assert usage["output_tokens_details"]["reasoning_tokens"] == 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    # every lifecycle event's response says the same
    for event in log_of(client, obj["task"]["id"]):
        if event["type"] in ev.WITH_RESPONSE:
            shown = event["response"]
            assert (shown["temperature"], shown["tools"], shown["text"]) == (
                0.25,
                obj["tools"],
                obj["text"],
            )


def test_defaults_are_the_numbers_used(client: TestClient) -> None:
    obj = client.post("/v1/responses", json=BODY).json()
    assert (obj["temperature"], obj["top_p"]) == (1.0, 1.0)
    assert obj["tools"] == [] and obj["tool_choice"] == "auto"
    assert obj["text"] == {"format": {"type": "text"}}
    assert obj["metadata"] == {} and obj["parallel_tool_calls"] is True
    # the runner draws with what the object shows: the same text as asking for it
    explicit = client.post("/v1/responses", json={**BODY, "temperature": 1.0, "top_p": 1}).json()
    assert text_of(explicit) == text_of(obj)


# -- stream framing --------------------------------------------------------------------------
def test_a_stream_carries_standard_types_by_default(client: TestClient) -> None:
    events = stream(client, "POST", "/v1/responses", json={**BODY, "stream": True})
    types = [e["type"] for e in events]
    assert set(types) <= ev.STANDARD
    assert types[0] == "response.created" and types[-1] == "response.completed"
    # the numbers are the log's: the loading event keeps its number, out of the stream
    log = log_of(client, events[0]["response"]["task"]["id"])
    assert events == [e for e in log if e["type"] not in ev.LMSP_LIFECYCLE]
    assert [e["sequence_number"] for e in log] == list(range(len(log)))


def test_include_shows_the_lifecycle_extensions_and_resume_keeps_working(
    client: TestClient,
) -> None:
    obj = client.post("/v1/responses", json=BODY).json()
    url = f"/v1/responses/{obj['id']}"
    full = stream(client, "GET", url, params={"stream": "true", "include": "lmsp.lifecycle"})
    assert full == log_of(client, obj["task"]["id"])
    plain = stream(client, "GET", url, params={"stream": "true"})
    assert plain == [e for e in full if e["type"] != "response.loading"]
    # Last-Event-ID and starting_after resume after any number, hidden ones too
    loading = next(e for e in full if e["type"] == "response.loading")["sequence_number"]
    resumed = stream(client, "GET", f"{url}?stream=true", headers={"Last-Event-ID": str(loading)})
    assert resumed == [e for e in plain if e["sequence_number"] > loading]
    tail = stream(client, "GET", url, params={"stream": "true", "starting_after": 5})
    assert tail == [e for e in plain if e["sequence_number"] > 5]


def test_the_task_event_stream_is_the_whole_log(client: TestClient) -> None:
    obj = client.post("/v1/responses", json=BODY).json()
    raw = raw_stream(client, "GET", f"/v1/tasks/{obj['task']['id']}/events")
    assert b"\r" not in raw and b"[DONE]" not in raw
    ids = [int(line[4:]) for line in raw.decode().split("\n") if line.startswith("id: ")]
    assert ids == list(range(len(log_of(client, obj["task"]["id"]))))


def test_unknown_include_values_are_refused(client: TestClient) -> None:
    obj = client.post("/v1/responses", json=BODY).json()
    bad = client.get(f"/v1/responses/{obj['id']}", params={"include": "nonsense"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "include"


# -- the field policy ------------------------------------------------------------------------
REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"tools": [{"type": "bogus_tool"}], "tool_choice": "none"}, "tools.0.type"),
    ({"tools": [{"type": "function", "name": "f"}, {"type": "teleport"}]}, "tools.1.type"),
    (
        {"tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}},
        "tool_choice.type",
    ),
    ({"tool_choice": {"type": "file_search"}}, "tool_choice.type"),
    ({"tools": [{"type": "function", "name": "f"}], "stop": ["x"]}, "stop"),
    ({"text": {"format": {"type": "json_object"}}, "stop": ["x"]}, "stop"),
    ({"service_tier": "scale"}, "service_tier"),
    ({"include": ["file_search_call.results"]}, "include"),
    ({"conversation": {"id": "conv_1", "x": 1}}, "conversation.x"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"context_management": [{"type": "other", "x": 1}]}, "context_management.0.type"),
    ({"prompt_cache_retention": "24h"}, "prompt_cache_retention"),
    ({"stream": True, "stream_options": {"include_obfuscation": True}}, "stream_options"),
]
INVALID: list[tuple[dict[str, Any], str]] = [
    ({"include": ["bogus"]}, "include"),
    ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
    ({"tools": [{"type": "function"}], "tool_choice": "none"}, "tools.0.name"),
    ({"tools": [{"type": "function", "name": "has space"}], "tool_choice": "none"}, "tools.0.name"),
    ({"background": True, "store": False}, "store"),
    ({"max_tool_calls": 0}, "max_tool_calls"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"temperature": 2.5}, "temperature"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "name": "f"}}, "tool_choice.name"),
    ({"tools": [{"type": "function", "name": "f"}] * 2}, "tools.1.name"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"truncation": "middle"}, "truncation"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"safety_identifier": "x" * 65}, "safety_identifier"),
]


@pytest.mark.parametrize(("extra", "param"), REFUSED)
def test_a_field_lmsp_cannot_honour_is_refused(
    client: TestClient, extra: dict[str, Any], param: str
) -> None:
    before = counts(client)
    answer = client.post("/v1/responses", json={**BODY, **extra}, headers={"Idempotency-Key": "k"})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "unsupported_parameter", error
    assert error["param"].startswith(param), error
    assert error["type"] == "invalid_request_error"
    assert counts(client) == before


@pytest.mark.parametrize(("extra", "param"), INVALID)
def test_an_invalid_field_is_named(client: TestClient, extra: dict[str, Any], param: str) -> None:
    before = counts(client)
    answer = client.post("/v1/responses", json={**BODY, **extra})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_value", error
    assert error["param"] == param, error
    assert counts(client) == before


def test_neutral_values_and_unknown_fields_are_accepted(client: TestClient) -> None:
    obj = client.post(
        "/v1/responses",
        json={
            **BODY,
            "presence_penalty": 0,
            "frequency_penalty": 0.0,
            "top_logprobs": 0,
            "top_k": 0,
            "min_p": 0,
            "repeat_penalty": 1,
            "conversation": None,
            "tool_choice": "auto",
            "tools": [],
            "a_field_from_the_future": {"x": 1},
        },
    )
    assert obj.status_code == 200, obj.text
    check_object(obj.json())


# -- cancel ----------------------------------------------------------------------------------
@pytest.fixture
def slow_client(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    """The app with a test engine that takes 200 ms a token (a response lasts ~5 s)."""
    monkeypatch.setenv("LMSP_TEST_ENGINE_DELAY", "0.2")
    with TestClient(create_app(settings)) as test_client:
        token = (settings.data_dir / "owner.token").read_text().strip()
        test_client.headers["Authorization"] = f"Bearer {token}"
        yield test_client


def test_cancel_answers_after_the_runner_stopped(slow_client: TestClient) -> None:
    created = slow_client.post("/v1/responses", json={**BODY, "background": True}).json()
    deadline = time.monotonic() + 60
    while not text_of(slow_client.get(f"/v1/responses/{created['id']}").json()):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    answered = slow_client.post(f"/v1/responses/{created['id']}/cancel")
    assert answered.status_code == 200
    obj = answered.json()
    check_object(obj)
    # generation was in full swing (24 tokens at 200 ms): the cancel won and was waited for
    assert obj["status"] == "cancelled", obj["status"]
    assert obj["task"]["status"] == "cancelled"
    assert text_of(obj) and obj["output"][0]["status"] == "incomplete"
    assert obj["completed_at"] is None
    log = log_of(slow_client, created["task"]["id"])
    assert log[-1]["type"] == "response.cancelled"
    for event in log:
        check_event(event)
    check_log_invariants(slow_client.app.state.lmsp.db.reader())  # type: ignore[attr-defined]


def test_a_task_cancel_waits_too(slow_client: TestClient) -> None:
    created = slow_client.post("/v1/responses", json={**BODY, "background": True}).json()
    wait_status(slow_client, created["id"], "in_progress")
    task = slow_client.post(f"/v1/tasks/{created['task']['id']}/cancel").json()
    assert task["status"] == "cancelled"


# -- stop sequences (an LMSP extension on /v1/responses; chat's ``stop``) --------------------
def test_a_stop_sequence_ends_the_answer(client: TestClient) -> None:
    whole = text_of(client.post("/v1/responses", json=BODY).json())
    words = whole.split(" ")
    stop = f"{words[5]} {words[6][:2]}"  # spans two tokens
    cut = whole.index(stop)
    obj = client.post("/v1/responses", json={**BODY, "stop": stop}).json()
    check_object(obj)
    assert obj["status"] == "completed"
    assert text_of(obj) == whole[:cut]
    assert obj["usage"]["output_tokens"] < 24
    streamed = stream(
        client, "POST", "/v1/responses", json={**BODY, "stop": [stop], "stream": True}
    )
    deltas = "".join(e["delta"] for e in streamed if e["type"] == "response.output_text.delta")
    assert deltas == whole[:cut]
    # a stop that never comes changes nothing
    assert text_of(client.post("/v1/responses", json={**BODY, "stop": ["§§"]}).json()) == whole


# -- store: false ----------------------------------------------------------------------------
def test_a_streamed_unstored_response_is_gone_after_its_stream(client: TestClient) -> None:
    events = stream(client, "POST", "/v1/responses", json={**BODY, "stream": True, "store": False})
    assert events[-1]["response"]["store"] is False
    gone = client.get(f"/v1/responses/{events[0]['response']['id']}")
    assert gone.status_code == 404
