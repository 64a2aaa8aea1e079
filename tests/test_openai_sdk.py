"""The official ``openai`` SDK against a real ``lmsp serve`` running the real model.

One server (and one model load) for the module. Outputs are kept short (temperature 0,
a few dozen tokens) so the module stays fast; the cancel test uses a long response so
that the cancel lands while it is still generating.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response

from lmsp.protocol.events import LMSP_LIFECYCLE
from tests.helpers import TERMINAL_EVENTS, Server, check_log_invariants, open_db, served

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
SHORT_MAX = 24  # output tokens for the short answers
FINISHED = {"completed", "incomplete", "failed", "cancelled"}
HANG_GUARD = 300.0  # seconds; only a hung service ever reaches it


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with served(tmp_path_factory.mktemp("sdk") / "data") as srv:
        yield srv


@pytest.fixture(scope="module")
def sdk(server: Server) -> Iterator[openai.OpenAI]:
    # no retries: an error answer must surface, not be papered over
    with openai.OpenAI(
        base_url=f"{server.url}/v1", api_key=server.token, max_retries=0, timeout=120
    ) as client:
        yield client


def task_id_of(response: Response) -> str:
    extra = response.model_extra or {}
    return str(extra["task"]["id"])


def wait_finished(sdk: openai.OpenAI, response_id: str) -> Response:
    deadline = time.monotonic() + HANG_GUARD
    while True:
        current = sdk.responses.retrieve(response_id)
        if current.status in FINISHED:
            return current
        assert time.monotonic() < deadline, f"{response_id} still {current.status}"
        time.sleep(0.1)


def task_events(server: Server, task_id: str) -> list[dict[str, Any]]:
    """The whole log through ``GET /v1/tasks/{id}/events`` as JSON pages."""
    out: list[dict[str, Any]] = []
    with server.client() as http:
        while True:
            page = http.get(
                f"/v1/tasks/{task_id}/events",
                params={"after": out[-1]["sequence_number"] if out else -1, "limit": 1000},
                headers={"Accept": "application/json"},
            )
            assert page.status_code == 200, page.text
            body = page.json()
            assert body["object"] == "list"
            out.extend(body["data"])
            if not body["has_more"]:
                return out


def assert_usage(response: Response, limit: int) -> None:
    usage = response.usage
    assert usage is not None
    assert usage.input_tokens > 0
    assert 0 < usage.output_tokens <= limit
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


def test_default_model_is_listed_first(sdk: openai.OpenAI) -> None:
    models = sdk.models.list().data
    assert models[0].id == MODEL
    assert models[0].model_extra and models[0].model_extra["format"] == "gguf"


def test_create_returns_the_final_response(sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(
        model=MODEL, input="Say hello to a friend.", max_output_tokens=SHORT_MAX, temperature=0
    )
    assert response.id.startswith("resp_")
    assert response.object == "response"
    assert response.model == MODEL
    assert response.status in ("completed", "incomplete")
    if response.status == "incomplete":
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text.strip()
    message = response.output[0]
    assert message.type == "message"
    assert message.role == "assistant"
    assert message.id.startswith("msg_")
    assert_usage(response, SHORT_MAX)
    extra = response.model_extra or {}
    assert str(extra["model_digest"]).startswith("sha256:")
    # stored by default: retrieve gives the same text
    again = sdk.responses.retrieve(response.id)
    assert again.status == response.status
    assert again.output_text == response.output_text


def test_create_stream_events(sdk: openai.OpenAI, server: Server) -> None:
    events = list(
        sdk.responses.create(
            model=MODEL,
            input="Name a colour.",
            stream=True,
            max_output_tokens=SHORT_MAX,
            temperature=0,
        )
    )
    seqs = [e.sequence_number for e in events]
    types = [e.type for e in events]
    assert types[0] == "response.created"
    # the log's numbers; the LMSP lifecycle extensions stay out of the stream by default
    log = task_events(server, task_id_of(events[0].response))  # type: ignore[union-attr]
    shown = [e for e in log if e["type"] not in LMSP_LIFECYCLE]
    assert seqs == [e["sequence_number"] for e in shown], seqs
    assert "response.loading" in [e["type"] for e in log]
    assert not set(types) & LMSP_LIFECYCLE
    assert types[-1] in ("response.completed", "response.incomplete")
    assert sum(t in TERMINAL_EVENTS for t in types) == 1
    first_delta = types.index("response.output_text.delta")
    assert types.index("response.output_item.added") < first_delta
    assert types.index("response.content_part.added") < first_delta
    assert (
        types.index("response.output_text.done")
        < types.index("response.content_part.done")
        < types.index("response.output_item.done")
        < len(types) - 1
    )
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed.strip()
    done = [e for e in events if e.type == "response.output_text.done"]
    assert done[0].text == streamed
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == streamed
    assert_usage(final, SHORT_MAX)
    assert sdk.responses.retrieve(final.id).output_text == streamed


def test_background_then_poll(sdk: openai.OpenAI, server: Server) -> None:
    created = sdk.responses.create(
        model=MODEL,
        input="Give one tip for sleeping well.",
        background=True,
        max_output_tokens=SHORT_MAX,
        temperature=0,
    )
    assert created.status == "queued"
    assert created.background is True
    assert created.output == []
    finished = wait_finished(sdk, created.id)
    assert finished.status in ("completed", "incomplete")
    assert finished.output_text.strip()
    assert_usage(finished, SHORT_MAX)
    task = task_id_of(finished)
    log = task_events(server, task)
    assert [e["type"] for e in log[:2]] == ["response.created", "response.queued"]
    deltas = "".join(e["delta"] for e in log if e["type"] == "response.output_text.delta")
    assert deltas == finished.output_text


def test_retrieve_stream_starting_after(sdk: openai.OpenAI) -> None:
    created = sdk.responses.create(
        model=MODEL,
        input="Describe the sea in one sentence.",
        background=True,
        max_output_tokens=SHORT_MAX,
        temperature=0,
    )
    # live: joined while the task is queued or generating (0..2 are created, queued,
    # loading; the lifecycle extensions only with include=lmsp.lifecycle)
    live = list(
        sdk.responses.retrieve(
            created.id,
            stream=True,
            starting_after=2,
            include=["lmsp.lifecycle"],  # type: ignore[list-item]
        )
    )
    seqs = [e.sequence_number for e in live]
    assert seqs == list(range(3, 3 + len(live))), seqs
    assert live[-1].type in ("response.completed", "response.incomplete")
    final = sdk.responses.retrieve(created.id)
    # everything after 2 holds every delta (0..2 are created, queued, loading)
    text = "".join(e.delta for e in live if e.type == "response.output_text.delta")
    assert text == final.output_text
    # replay of a finished log from a later point: exactly the tail
    last = live[-1].sequence_number
    tail = list(sdk.responses.retrieve(created.id, stream=True, starting_after=last - 3))
    assert [e.sequence_number for e in tail] == [last - 2, last - 1, last]
    assert [e.type for e in tail] == [e.type for e in live[-3:]]


def test_stream_helper_accumulates_the_final_response(sdk: openai.OpenAI) -> None:
    # a prompt the model answers in a few tokens, so it ends with `response.completed`
    # (the SDK helper's get_final_response() only accepts that terminal event)
    with sdk.responses.stream(
        model=MODEL,
        input="What is 2+2? Answer with a number only.",
        max_output_tokens=64,
        temperature=0,
    ) as stream:
        snapshots = [e.snapshot for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed"
    assert final.output_text.strip()
    assert snapshots and snapshots[-1] == final.output_text
    assert_usage(final, 64)


def test_stream_helper_resumes_a_background_response(sdk: openai.OpenAI, server: Server) -> None:
    created = sdk.responses.create(
        model=MODEL,
        input="What is 3+3? Answer with a number only.",
        background=True,
        max_output_tokens=64,
        temperature=0,
    )
    with sdk.responses.stream(response_id=created.id, starting_after=1) as stream:
        seqs = [e.sequence_number for e in stream]
        final = stream.get_final_response()
    log = task_events(server, task_id_of(created))
    assert seqs == [
        e["sequence_number"]
        for e in log
        if e["sequence_number"] > 1 and e["type"] not in LMSP_LIFECYCLE
    ], seqs
    assert final.id == created.id
    assert final.status == "completed"
    assert final.output_text == sdk.responses.retrieve(created.id).output_text


def test_cancel_a_long_running_background_response(sdk: openai.OpenAI, server: Server) -> None:
    created = sdk.responses.create(
        model=MODEL,
        input="Write a very long story about a lighthouse keeper.",
        background=True,
        max_output_tokens=400,
        temperature=0,
    )
    task = task_id_of(created)
    deadline = time.monotonic() + HANG_GUARD
    # let it generate: some text is persisted, so the cancel lands mid-generation
    while not sdk.responses.retrieve(created.id).output_text:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    answered = sdk.responses.cancel(created.id)
    assert answered.id == created.id
    # the cancel answers once the runner has stopped: cancelled, or finished if
    # generation won the race
    assert answered.status in ("cancelled", "completed", "incomplete")
    final = wait_finished(sdk, created.id)
    assert final.status in ("cancelled", "completed", "incomplete")
    # cancel is idempotent: the same 200 and the same finished state
    assert sdk.responses.cancel(created.id).status == final.status

    log = task_events(server, task)
    assert [e["sequence_number"] for e in log] == list(range(len(log)))
    terminal = [e["type"] for e in log if e["type"] in TERMINAL_EVENTS]
    assert len(terminal) == 1, terminal
    assert log[-1]["type"] == terminal[0]
    expected = {
        "cancelled": "response.cancelled",
        "completed": "response.completed",
        "incomplete": "response.incomplete",
    }[final.status]
    assert terminal[0] == expected
    if final.status == "cancelled":
        types = [e["type"] for e in log]
        assert "response.completed" not in types and "response.incomplete" not in types
        if "response.cancelling" in types:
            assert types.index("response.cancelling") == len(types) - 2
        # the text kept is exactly what was logged before the cancel
        deltas = "".join(e["delta"] for e in log if e["type"] == "response.output_text.delta")
        assert deltas
        assert final.output_text == deltas
    with server.client() as http:
        task_row = http.get(f"/v1/tasks/{task}").json()
    assert task_row["status"] == ("completed" if final.status == "incomplete" else final.status)
    assert task_row["last_sequence_number"] == log[-1]["sequence_number"]


def test_every_log_on_disk_is_well_formed(sdk: openai.OpenAI, server: Server) -> None:
    """After the SDK traffic above, the SQLite file itself holds gap-free logs."""
    # at least one task, even when this test runs alone
    sdk.responses.create(model=MODEL, input="Say yes.", max_output_tokens=SHORT_MAX, temperature=0)
    conn = open_db(server.data_dir)
    try:
        check_log_invariants(conn)
        count = conn.execute("SELECT count(*) FROM tasks").fetchone()[0]
        assert count >= 1
    finally:
        conn.close()


def test_wrong_token_is_an_sdk_authentication_error(server: Server) -> None:
    with (
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="not-a-token", max_retries=0) as client,
        pytest.raises(openai.AuthenticationError),
    ):
        client.responses.retrieve("resp_missing")
    with httpx.Client(base_url=server.url) as http:
        assert http.get("/v1/models").status_code == 401
