"""``kill -9`` of the server while the official ``anthropic`` SDK streams a message: the
message's task follows its ``on_restart`` policy, and the message is followed again by
its id (``GET /v1/messages/{id}?stream=true``) or, once finished, replayed by its
``Idempotency-Key``.

The server is a real ``lmsp serve`` subprocess with the deterministic test engine (a
token every 150 ms, so the kill lands mid-stream); the kill is ``SIGKILL``, so no
shutdown code runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic.types import RawMessageStreamEvent

from tests.helpers import Server, check_log_invariants, open_db, served, task_log

pytestmark = pytest.mark.slow

MODEL = "lmsp-test"
PROMPT: Any = [{"role": "user", "content": "a message that outlives its server"}]
SEEN_BEFORE_KILL = 5  # text deltas read before the kill (of 24)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with served(tmp_path / "data", env={"LMSP_TEST_ENGINE_DELAY": "0.15"}) as srv:
        yield srv


def sdk_for(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.url, api_key=server.token, max_retries=0, timeout=120
    )


def stream_until_killed(server: Server, policy: str, key: str) -> tuple[str, str]:
    """Stream a message, kill the server after a few deltas; its id and the text seen."""
    seen = ""
    message_id = ""
    with sdk_for(server) as sdk:
        stream = sdk.messages.stream(
            model=MODEL,
            max_tokens=100,
            messages=PROMPT,
            extra_body={"seed": 3, "on_restart": policy},
            extra_headers={"Idempotency-Key": key},
        )
        broke: Exception | None = None
        try:
            with stream as events:
                deltas = 0
                for event in events:
                    if event.type == "message_start":
                        message_id = event.message.id
                    elif event.type == "content_block_delta" and event.delta.type == "text_delta":
                        seen += event.delta.text
                        deltas += 1
                        if deltas == SEEN_BEFORE_KILL:
                            server.kill()
        except Exception as exc:  # the connection died with the server (the SDK's HTTP error)
            broke = exc
    assert broke is not None and message_id and seen
    return message_id, seen


def follow(server: Server, message_id: str) -> list[Any]:
    """Every event of ``GET /v1/messages/{id}?stream=true``, read with the SDK's types."""
    with sdk_for(server) as sdk:
        events = sdk.get(
            f"/v1/messages/{message_id}",
            options={"params": {"stream": "true"}},
            cast_to=RawMessageStreamEvent,  # type: ignore[arg-type]
            stream=True,
            stream_cls=anthropic.Stream[RawMessageStreamEvent],
        )
        return list(events)


def text_of(events: list[Any]) -> str:
    return "".join(
        e.delta.text
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )


def uninterrupted(server: Server) -> str:
    """The same message run to its end without a crash (the engine is deterministic)."""
    with sdk_for(server) as sdk:
        made = sdk.messages.create(
            model=MODEL, max_tokens=100, messages=PROMPT, extra_body={"seed": 3}
        )
    assert made.content[0].type == "text"
    return made.content[0].text


def log_types(server: Server, message_id: str) -> list[dict[str, Any]]:
    conn = open_db(server.data_dir)
    try:
        task = conn.execute("SELECT id FROM tasks WHERE response_id = ?", (message_id,)).fetchone()
        check_log_invariants(conn)
        return task_log(conn, task["id"])
    finally:
        conn.close()


def test_resume_goes_on_where_the_stream_broke(server: Server) -> None:
    message_id, seen = stream_until_killed(server, "resume", "crash-resume")
    server.start()
    events = follow(server, message_id)
    assert events[0].type == "message_start" and events[0].message.id == message_id
    assert events[-1].type == "message_stop"
    text = text_of(events)
    assert text.startswith(seen) and text == uninterrupted(server)
    log = log_types(server, message_id)
    assert any(e["type"] == "response.in_progress" and e.get("resumed") for e in log)
    # finished now: the same request with the same key replays the whole message
    with sdk_for(server) as sdk:
        replayed = sdk.messages.with_raw_response.create(
            model=MODEL,
            max_tokens=100,
            messages=PROMPT,
            stream=True,
            extra_body={"seed": 3, "on_restart": "resume"},
            extra_headers={"Idempotency-Key": "crash-resume"},
        )
        assert replayed.headers["idempotent-replayed"] == "true"
        again = list(replayed.parse())
    assert text_of(again) == text


def test_fail_answers_the_restart_as_an_error(server: Server) -> None:
    message_id, _ = stream_until_killed(server, "fail", "crash-fail")
    server.start()
    with sdk_for(server) as sdk:
        with pytest.raises(anthropic.InternalServerError) as failed:
            sdk.get(f"/v1/messages/{message_id}", cast_to=object)
        assert isinstance(failed.value.body, dict)
        assert failed.value.body["error"]["type"] == "api_error"
        # followed again, the stream ends with an error event, which the SDK raises
        with pytest.raises(anthropic.APIStatusError) as streamed:
            list(
                sdk.get(
                    f"/v1/messages/{message_id}",
                    options={"params": {"stream": "true"}},
                    cast_to=RawMessageStreamEvent,  # type: ignore[arg-type]
                    stream=True,
                    stream_cls=anthropic.Stream[RawMessageStreamEvent],
                )
            )
        assert isinstance(streamed.value.body, dict)
        assert streamed.value.body["error"]["type"] == "api_error"
    assert log_types(server, message_id)[-1]["response"]["error"]["code"] == "server_restarted"


def test_retry_starts_over_and_the_follower_sees_one_whole_attempt(server: Server) -> None:
    message_id, _ = stream_until_killed(server, "retry", "crash-retry")
    server.start()
    events = follow(server, message_id)
    assert events[-1].type == "message_stop"
    assert [e.type for e in events].count("message_start") == 1
    assert text_of(events) == uninterrupted(server)
    log = log_types(server, message_id)
    assert any(e["type"] == "response.queued" and e.get("reset") for e in log)
